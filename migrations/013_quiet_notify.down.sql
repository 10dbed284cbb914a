CREATE OR REPLACE FUNCTION {{schema}}.notify_events() RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    PERFORM pg_notify(TG_TABLE_SCHEMA || '.events', '');
    RETURN NULL;
END
$$;
