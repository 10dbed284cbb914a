-- Relay's bookkeeping. Users never write these tables.

-- What the relay has durably published: the source position of the last
-- acknowledged event and the sink's own progress (for the embedded broker,
-- its producer id and next sequence per partition). Saved in the same
-- transaction that removes the published rows. Positions are unsigned 64-bit
-- values stored in bigint's bits.
CREATE TABLE {{schema}}.checkpoints (
    name           text PRIMARY KEY,
    position_major bigint NOT NULL DEFAULT 0,
    position_minor bigint NOT NULL DEFAULT 0,
    sink_state     bytea,
    published      bigint NOT NULL DEFAULT 0,
    updated_at     timestamptz NOT NULL DEFAULT now()
);

-- Events that can never be published (bad topic, oversize payload, malformed
-- headers), with the original row and the reason. Everything else flows on.
CREATE TABLE {{schema}}.dead_letters (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    event_row_id bigint NOT NULL,
    event_id     uuid NOT NULL,
    topic        text NOT NULL,
    key          text,
    payload      bytea,
    headers      jsonb,
    created_at   timestamptz NOT NULL,
    error        text NOT NULL,
    failed_at    timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX dead_letters_failed_at ON {{schema}}.dead_letters (failed_at);

-- Wakes the polling reader within milliseconds of a commit. NOTIFY is sent at
-- commit, once per transaction and channel however many rows it wrote; the
-- poller also polls on an interval, since notifications are lost while it is
-- disconnected.
CREATE FUNCTION {{schema}}.notify_events() RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    PERFORM pg_notify(TG_TABLE_SCHEMA || '.events', '');
    RETURN NULL;
END
$$;

CREATE TRIGGER events_notify AFTER INSERT ON {{schema}}.events
    FOR EACH STATEMENT EXECUTE FUNCTION {{schema}}.notify_events();
