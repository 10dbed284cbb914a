-- The outbox: one row per event, written by the service in the same
-- transaction as its business rows. Users set topic, key, payload and
-- headers; every other column belongs to Relay and has a default.
CREATE TABLE {{schema}}.events (
    -- Relay's ordering id: assigned at INSERT, so it is NOT commit order.
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    -- The writing transaction's id. The polling reader reads only rows whose
    -- transaction is older than every transaction still running, so a row
    -- that commits late is never skipped, and orders by (txid, id).
    txid       xid8 NOT NULL DEFAULT pg_current_xact_id(),
    -- Published as the "relay-event-id" header so consumers can deduplicate.
    event_id   uuid NOT NULL DEFAULT gen_random_uuid(),
    -- Kafka topic rules ([a-zA-Z0-9._-], 1..249) are checked by the relay,
    -- not here: a bad topic goes to the dead-letter table instead of failing
    -- the service's transaction.
    topic      text NOT NULL,
    -- Picks the partition, and so the order. NULL: no key.
    key        text,
    -- NULL is a tombstone: it deletes the key on a compacted topic.
    payload    bytea,
    -- A JSON object of string to string, published as record headers.
    headers    jsonb,
    -- Published as the record's timestamp.
    created_at timestamptz NOT NULL DEFAULT clock_timestamp()
);

CREATE INDEX events_txid_id ON {{schema}}.events (txid, id);

COMMENT ON TABLE {{schema}}.events IS
    'Transactional outbox drained by Relay. INSERT topic, key, payload, headers (or call emit()) in the transaction that changes your data.';

-- emit writes one event and returns its event id. It is the same as the
-- INSERT and runs in the caller's transaction.
CREATE FUNCTION {{schema}}.emit(topic text, key text, payload bytea, headers jsonb DEFAULT NULL)
RETURNS uuid
LANGUAGE sql
AS $$
    INSERT INTO {{schema}}.events (topic, key, payload, headers)
    VALUES ($1, $2, $3, $4)
    RETURNING event_id
$$;

-- The text form stores the payload as UTF-8 bytes, so that
-- emit('orders', 'order-42', '{"status":"paid"}') needs no cast.
CREATE FUNCTION {{schema}}.emit(topic text, key text, payload text, headers jsonb DEFAULT NULL)
RETURNS uuid
LANGUAGE sql
AS $$
    SELECT {{schema}}.emit($1, $2, convert_to($3, 'UTF8'), $4)
$$;
