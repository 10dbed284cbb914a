DROP FUNCTION {{schema}}.emit(text, text, text, jsonb);
DROP FUNCTION {{schema}}.emit(text, text, bytea, jsonb);
DROP TABLE {{schema}}.events;
