-- Leadership of this outbox, fenced by epoch.
--
-- leadership holds the epoch of the current leader, incremented at each
-- takeover. Every acknowledgement transaction locks this row FOR SHARE and
-- checks the epoch it was elected with, so a deposed leader can never delete
-- rows, save a checkpoint or finish a replay, and a takeover (which updates
-- the row) waits for an acknowledgement already running.
--
-- leader_lease is how the leader shows it is alive: it increments renewals
-- every fraction of lease_ms. A standby that sees (epoch, renewals) unchanged
-- for lease_ms of its own monotonic clock, or released set by a leader that
-- stopped cleanly, takes over with a compare-and-swap on both. Renewals live
-- in their own row so that an acknowledgement waiting on a lock never holds
-- them up.
CREATE TABLE {{schema}}.leadership (
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    epoch     bigint NOT NULL,
    holder    text NOT NULL,
    since     timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE {{schema}}.leader_lease (
    singleton  boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    epoch      bigint NOT NULL,
    renewals   bigint NOT NULL DEFAULT 0,
    lease_ms   integer NOT NULL CHECK (lease_ms > 0),
    released   boolean NOT NULL DEFAULT false,
    renewed_at timestamptz NOT NULL DEFAULT now()
);

INSERT INTO {{schema}}.leadership (epoch, holder) VALUES (0, '');
INSERT INTO {{schema}}.leader_lease (epoch, lease_ms, released) VALUES (0, 1, true);
