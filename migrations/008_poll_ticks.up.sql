-- The polling reader's ticks. A tick is a snapshot of the cluster's
-- transactions (pg_current_snapshot()); the batch of tick n is the outbox
-- rows whose writing transaction is visible in tick n and was not in the
-- tick before it, so batches follow commits and a long transaction delays
-- only its own rows. The reader records a tick before it delivers any of
-- its rows, and only ticks that have rows, so that after a crash it delivers
-- the unacknowledged rows again in the order it first did; it deletes the
-- ticks before the acknowledged one. by_commit_ts records whether the batch
-- was ordered by commit timestamp (track_commit_timestamp on) or by row id,
-- so that a replay of the tick orders its rows the same way.
CREATE TABLE {{schema}}.poll_ticks (
    tick         bigint PRIMARY KEY,
    snapshot     pg_snapshot NOT NULL,
    by_commit_ts boolean NOT NULL,
    taken_at     timestamptz NOT NULL DEFAULT now()
);
