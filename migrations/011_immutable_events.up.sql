-- Outbox rows are immutable: an event is what its INSERT wrote. The WAL
-- reader publishes the insert as it was logged, the polling reader the row
-- as it is when read; a row changed or deleted afterwards, even in the
-- transaction that wrote it, would be published differently by the two
-- (or published although it was deleted). So UPDATE, DELETE and TRUNCATE
-- of the outbox are refused, with an error that says why, unless the
-- transaction set relay.allow_outbox_changes = on: the relay's
-- acknowledgement does (it deletes published rows), and an operator who
-- must remove rows may, knowing those events may or may not be published.
-- The check is one statement-level trigger whose WHEN clause skips the
-- function for the relay, so the acknowledgement's deletes cost no
-- per-row call. It guards against mistakes, not against a hostile role:
-- that is GRANT's job.
CREATE FUNCTION {{schema}}.refuse_event_changes() RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    RAISE EXCEPTION 'outbox events are immutable: % on %.% refused', TG_OP, TG_TABLE_SCHEMA, TG_TABLE_NAME
        USING ERRCODE = 'restrict_violation',
        DETAIL = 'An event is published as its INSERT wrote it; changing or deleting the row afterwards, even in the same transaction, would make the WAL reader (which sends the insert) and the polling reader (which reads the row) publish different things.',
        HINT = 'Insert each event once with its final content; to withdraw one, roll back the transaction or a savepoint. Relay deletes published rows itself. An operator who must remove rows runs SET LOCAL relay.allow_outbox_changes = on in that transaction first, and those events may or may not be published.';
END
$$;

CREATE TRIGGER events_immutable BEFORE UPDATE OR DELETE OR TRUNCATE ON {{schema}}.events
    FOR EACH STATEMENT
    WHEN (current_setting('relay.allow_outbox_changes', true) IS DISTINCT FROM 'on')
    EXECUTE FUNCTION {{schema}}.refuse_event_changes();
