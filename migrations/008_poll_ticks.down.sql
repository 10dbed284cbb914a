DROP TABLE {{schema}}.poll_ticks;
