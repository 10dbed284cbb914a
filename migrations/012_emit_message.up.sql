-- The tableless outbox, for the WAL reader (cdc/) only: emit_message writes
-- an event as a transactional logical decoding message
-- (pg_logical_emit_message) instead of a row, so nothing is inserted,
-- deleted or vacuumed for it. The message is part of the caller's
-- transaction: it is decoded only if that commits, at its place among the
-- transaction's outbox inserts, which the WAL reader keeps. The poll reader
-- cannot see messages, so emit_message refuses to write one unless a WAL
-- reader of this outbox has its replication slot (the slot decodes only
-- what is written after its creation) and the relay's progress was not
-- last recorded by the poll reader. The content is the event's metadata as
-- JSON text (event_id, topic, key, headers, created_at, tombstone), a zero
-- byte, and the payload. The first message written to a slot sets its
-- cdc_slots.messages: while such a slot exists the poll reader refuses to
-- start, since messages it cannot see may be waiting in the slot's WAL.
-- SECURITY DEFINER: a service role needs neither access to the relay's
-- tables nor the right to emit messages; it needs what a row would, the
-- INSERT privilege on the outbox table (checked for the session's role).
ALTER TABLE {{schema}}.cdc_slots ADD COLUMN messages boolean NOT NULL DEFAULT false;

CREATE FUNCTION {{schema}}.emit_message(topic text, key text, payload bytea, headers jsonb DEFAULT NULL)
RETURNS uuid
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    event_id uuid := gen_random_uuid();
    slot text;
    marked boolean;
BEGIN
    IF NOT has_table_privilege(session_user, '{{schema}}.events', 'INSERT') THEN
        RAISE EXCEPTION 'emit_message: permission denied: role % may not write events (it lacks INSERT on the outbox table)', session_user
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF $1 IS NULL THEN
        RAISE EXCEPTION 'emit_message: topic is NULL' USING ERRCODE = 'not_null_violation';
    END IF;
    IF EXISTS (SELECT 1 FROM {{schema}}.checkpoints AS c WHERE c.source = 'poll') THEN
        RAISE EXCEPTION 'emit_message: the relay reads this outbox with the poll reader, which cannot see logical messages'
            USING ERRCODE = 'object_not_in_prerequisite_state',
            HINT = 'Run the relay with --source cdc, or write the event as a row (INSERT INTO the outbox table, or emit()).';
    END IF;
    SELECT c.slot_name, c.messages INTO slot, marked FROM {{schema}}.cdc_slots AS c
        JOIN pg_replication_slots AS s ON s.slot_name = c.slot_name AND s.database = current_database()
        WHERE c.consistent_lsn IS NOT NULL AND s.wal_status IS DISTINCT FROM 'lost'
        ORDER BY c.created_at DESC LIMIT 1;
    IF slot IS NULL THEN
        RAISE EXCEPTION 'emit_message: no WAL reader of this outbox has a replication slot, so the message would never be published'
            USING ERRCODE = 'object_not_in_prerequisite_state',
            HINT = 'Start the relay with --source cdc first (it creates its slot), or write the event as a row (INSERT INTO the outbox table, or emit()).';
    END IF;
    IF NOT marked THEN
        UPDATE {{schema}}.cdc_slots SET messages = true WHERE slot_name = slot;
    END IF;
    PERFORM pg_logical_emit_message(true, 'relay:{{schema}}',
        convert_to(jsonb_build_object('event_id', event_id, 'topic', $1, 'key', $2, 'headers', $4,
            'created_at', clock_timestamp(), 'tombstone', $3 IS NULL)::text, 'UTF8')
        || '\x00'::bytea || coalesce($3, ''::bytea));
    RETURN event_id;
END
$$;

-- The text form stores the payload as UTF-8 bytes, as emit()'s does.
CREATE FUNCTION {{schema}}.emit_message(topic text, key text, payload text, headers jsonb DEFAULT NULL)
RETURNS uuid
LANGUAGE sql
AS $$
    SELECT {{schema}}.emit_message($1, $2, convert_to($3, 'UTF8'), $4)
$$;
