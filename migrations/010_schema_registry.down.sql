DROP TABLE {{schema}}.registry_state;
DROP TABLE {{schema}}.registry_config;
DROP TABLE {{schema}}.registry_versions;
DROP TABLE {{schema}}.registry_schemas;
