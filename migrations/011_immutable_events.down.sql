DROP TRIGGER events_immutable ON {{schema}}.events;
DROP FUNCTION {{schema}}.refuse_event_changes();
