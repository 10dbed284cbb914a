DROP TABLE {{schema}}.leader_lease;
DROP TABLE {{schema}}.leadership;
