-- The hold-key dead-letter policy (relay run --dead-letter-policy hold-key).
-- A dead letter that holds its key (holds) keeps the key's later events out
-- of the log: the relay moves each of them, in stream order, into this table
-- as a held row (held_by: the event_row_id of the holding dead letter,
-- reason 'held'), in the same transaction that acknowledges its batch. A
-- holding dead letter that was retried or discarded (resolution set while
-- holds is still true) is released by the leader: the retried event
-- (republished_at records when) and then the held rows are published in
-- their order, each held row marked 'released' as its batch is
-- acknowledged, and holds is cleared in the transaction that acknowledges
-- the last one. The key is held exactly while a row with holds exists.
ALTER TABLE {{schema}}.dead_letters
    ADD COLUMN holds          boolean NOT NULL DEFAULT false,
    ADD COLUMN held_by        bigint,
    ADD COLUMN republished_at timestamptz,
    DROP CONSTRAINT dead_letters_resolution_check,
    ADD CONSTRAINT dead_letters_resolution_check CHECK (resolution IN ('retried', 'discarded', 'released'));

CREATE INDEX dead_letters_holding ON {{schema}}.dead_letters (topic, key) WHERE holds;
CREATE INDEX dead_letters_held ON {{schema}}.dead_letters (held_by, id) WHERE held_by IS NOT NULL AND resolution IS NULL;
