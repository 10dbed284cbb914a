DROP TABLE {{schema}}.cdc_slots;
