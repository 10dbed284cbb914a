-- The inbox: one row per event a consumer group applied, and the events it
-- gave up on. {{schema}} is replaced by the schema's quoted name.
CREATE TABLE {{schema}}.processed (
	consumer_group text NOT NULL,
	event_id text NOT NULL,
	topic text NOT NULL,
	partition integer NOT NULL,
	"offset" bigint NOT NULL,
	processed_at timestamptz NOT NULL DEFAULT now(),
	PRIMARY KEY (consumer_group, event_id)
);

-- The prune deletes by position below the group's committed offset.
CREATE INDEX processed_position ON {{schema}}.processed (consumer_group, topic, partition, "offset");

CREATE TABLE {{schema}}.dead_letters (
	id bigserial PRIMARY KEY,
	consumer_group text NOT NULL,
	event_id text NOT NULL,
	topic text NOT NULL,
	partition integer NOT NULL,
	"offset" bigint NOT NULL,
	key bytea,
	value bytea,
	headers jsonb NOT NULL DEFAULT '[]',
	record_time timestamptz,
	attempts integer NOT NULL,
	reason text NOT NULL,
	-- held: the record did not fail; an earlier record of its key did, and
	-- the hold-key policy keeps the key's later records behind it.
	held boolean NOT NULL DEFAULT false,
	created_at timestamptz NOT NULL DEFAULT now(),
	UNIQUE (consumer_group, event_id)
);

CREATE INDEX dead_letters_key ON {{schema}}.dead_letters (consumer_group, topic, key, partition, "offset");
