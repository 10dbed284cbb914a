DROP INDEX {{schema}}.dead_letters_held;
DROP INDEX {{schema}}.dead_letters_holding;
UPDATE {{schema}}.dead_letters SET resolution = 'retried' WHERE resolution = 'released';
ALTER TABLE {{schema}}.dead_letters
    DROP CONSTRAINT dead_letters_resolution_check,
    ADD CONSTRAINT dead_letters_resolution_check CHECK (resolution IN ('retried', 'discarded')),
    DROP COLUMN republished_at,
    DROP COLUMN held_by,
    DROP COLUMN holds;
