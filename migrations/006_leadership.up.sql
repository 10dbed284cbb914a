-- Leadership of this outbox, fenced by epoch. One row: the epoch of the
-- current leader (incremented at each takeover), who holds it, and how often
-- it renews its lease. A leader renews by incrementing renewals; a standby
-- that sees (epoch, renewals) unchanged for lease_ms of its own monotonic
-- clock takes over with a compare-and-swap on both. Every acknowledgement
-- transaction locks this row FOR SHARE and checks its epoch, so a deposed
-- leader can never delete rows, save a checkpoint or finish a replay, and a
-- takeover waits for an acknowledgement already running.
CREATE TABLE {{schema}}.leadership (
    singleton  boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    epoch      bigint NOT NULL,
    holder     text NOT NULL,
    lease_ms   integer NOT NULL CHECK (lease_ms > 0),
    renewals   bigint NOT NULL DEFAULT 0,
    released   boolean NOT NULL DEFAULT false,
    renewed_at timestamptz NOT NULL DEFAULT now(),
    since      timestamptz NOT NULL DEFAULT now()
);
