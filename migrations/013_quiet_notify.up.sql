-- Commits of outbox rows notify the poll reader only while it sleeps.
--
-- NOTIFY serializes commits: a transaction that notifies takes one
-- cluster-wide lock at commit and holds it until its commit record is
-- flushed, so every writer of the outbox queued behind every other one,
-- fsync by fsync (seen under relay bench as writers waiting on "Lock:
-- object" for more than half their time, and short of the rate asked).
-- A notification is needed only when the reader waits for one.
--
-- The poll reader holds a session advisory lock, exclusively, while it
-- sleeps (the key: 0x52454c41 in the high 32 bits, the outbox table's oid
-- in the low ones). A writing statement takes the same key shared for its
-- transaction when it can, and then sends nothing: the reader cannot fall
-- asleep before that transaction ends, and once asleep it reads again
-- first, so it sees the rows. When the reader holds the key, the writer
-- notifies as before. poller/doc.go ("Wake-up and cost") gives the whole
-- argument. With no poll reader (the WAL reader), nothing notifies.
--
-- A relay older than this migration never takes the key, so while one
-- still leads, events wait for its poll interval (1 s by default).
CREATE OR REPLACE FUNCTION {{schema}}.notify_events() RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    IF NOT pg_catalog.pg_try_advisory_xact_lock_shared((1380273217::bigint << 32) | TG_RELID::bigint) THEN
        PERFORM pg_catalog.pg_notify(TG_TABLE_SCHEMA || '.events', '');
    END IF;
    RETURN NULL;
END
$$;
