DROP TRIGGER events_notify ON {{schema}}.events;
DROP FUNCTION {{schema}}.notify_events();
DROP TABLE {{schema}}.dead_letters;
DROP TABLE {{schema}}.checkpoints;
