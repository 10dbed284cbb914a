-- Which reader wrote each checkpoint's position. Positions of the polling
-- reader (transaction ids) and of the WAL reader (LSNs) are not comparable:
-- a relay switched from one to the other restarts its position from the
-- beginning of the outbox (the rows still there are exactly the unpublished
-- ones) and keeps the sink's state.
ALTER TABLE {{schema}}.checkpoints ADD COLUMN source text NOT NULL DEFAULT '';
