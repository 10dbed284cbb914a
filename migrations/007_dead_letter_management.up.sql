-- Managed dead letters (`relay dead-letters list|show|retry|discard`).
-- reason is the machine-readable cause (the relay_dead_letters_total
-- label); rows from before this migration say 'unknown'. A dead letter is
-- resolved once: retried (its event went back into the outbox with its
-- original event id) or discarded (on purpose, with a note). Resolved rows
-- stay as the record of what was done.
ALTER TABLE {{schema}}.dead_letters
    ADD COLUMN reason      text NOT NULL DEFAULT 'unknown',
    ADD COLUMN resolution  text CHECK (resolution IN ('retried', 'discarded')),
    ADD COLUMN resolved_at timestamptz,
    ADD COLUMN note        text;

CREATE INDEX dead_letters_unresolved ON {{schema}}.dead_letters (id) WHERE resolution IS NULL;
