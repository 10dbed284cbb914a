DROP TABLE {{schema}}.leadership;
