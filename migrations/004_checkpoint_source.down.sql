ALTER TABLE {{schema}}.checkpoints DROP COLUMN source;
