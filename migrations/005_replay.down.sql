DROP TABLE {{schema}}.replay_requests;
DROP TABLE {{schema}}.events_archive;
