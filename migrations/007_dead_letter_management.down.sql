DROP INDEX {{schema}}.dead_letters_unresolved;
ALTER TABLE {{schema}}.dead_letters
    DROP COLUMN note,
    DROP COLUMN resolved_at,
    DROP COLUMN resolution,
    DROP COLUMN reason;
