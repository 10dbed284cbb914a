-- Retention for replay. With `relay run --retain D`, the acknowledgement
-- moves each published row here (instead of deleting it) in the same
-- transaction that saves the checkpoint, and a pruner deletes rows published
-- longer than D ago, in bounded batches. seq is the publication order: the
-- acknowledgement inserts a batch's rows in the order the sink received
-- them, and only the leader inserts, so replaying by seq republishes events
-- in their original order.
CREATE TABLE {{schema}}.events_archive (
    seq          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    id           bigint NOT NULL,
    txid         xid8 NOT NULL,
    event_id     uuid NOT NULL,
    topic        text NOT NULL,
    key          text,
    payload      bytea,
    headers      jsonb,
    created_at   timestamptz NOT NULL,
    published_at timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX events_archive_event_id ON {{schema}}.events_archive (event_id);
CREATE INDEX events_archive_created_at ON {{schema}}.events_archive (created_at);

-- Replay requests: `relay replay` inserts one; the leader executes it
-- between live batches. cursor is the archive seq of the last event
-- replayed and acknowledged (saved with the sink's state in the ack
-- transaction). inflight_through, set before a chunk is handed to the sink
-- and cleared by its acknowledgement, makes a restarted leader republish
-- exactly that chunk first, so the embedded broker's sequence numbers meet
-- the same events again. bound is the last archive seq the replay covers,
-- fixed when it starts.
CREATE TABLE {{schema}}.replay_requests (
    id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    filter           jsonb NOT NULL,
    status           text NOT NULL DEFAULT 'pending'
        CHECK (status IN ('pending', 'running', 'done', 'cancelled', 'failed')),
    total            bigint,
    done             bigint NOT NULL DEFAULT 0,
    cursor           bigint NOT NULL DEFAULT 0,
    bound            bigint,
    inflight_through bigint,
    error            text,
    created_at       timestamptz NOT NULL DEFAULT now(),
    started_at       timestamptz,
    updated_at       timestamptz NOT NULL DEFAULT now(),
    finished_at      timestamptz
);
