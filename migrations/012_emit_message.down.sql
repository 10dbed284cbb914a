DROP FUNCTION {{schema}}.emit_message(text, text, text, jsonb);
DROP FUNCTION {{schema}}.emit_message(text, text, bytea, jsonb);
ALTER TABLE {{schema}}.cdc_slots DROP COLUMN messages;
