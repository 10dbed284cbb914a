-- The WAL reader's (cdc/) record of each replication slot it created: the
-- consistent point and the snapshot of the creation. Outbox rows visible in
-- that snapshot committed before the slot's first streamed transaction, so
-- the reader publishes them from the table; the record lets it finish that
-- after a crash. NULL position and snapshot: a creation in progress, redone
-- at the next start. The snapshot is cleared once those rows are published;
-- the row stays, so that a slot without one is known not to be the relay's.
CREATE TABLE {{schema}}.cdc_slots (
    slot_name      text PRIMARY KEY,
    consistent_lsn pg_lsn,
    snapshot       pg_snapshot,
    created_at     timestamptz NOT NULL DEFAULT now()
);
