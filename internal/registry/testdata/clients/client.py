"""Drives Debian's python3-confluent-kafka against the relay's embedded
schema registry and broker, for internal/registry/clients_test.go.

  client.py register URL SUBJECT SCHEMA_FILE   registers, prints the id
  client.py consume BROKERS TOPIC COUNT URL    consumes COUNT records from
      the start of TOPIC, decodes each value with the Avro deserializer,
      prints one JSON object per line: {"key", "value", "schema_id"}
"""
import json
import struct
import sys

from confluent_kafka import Consumer
from confluent_kafka.avro import CachedSchemaRegistryClient
from confluent_kafka.avro.serializer.message_serializer import MessageSerializer
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient


def register(url, subject, path):
    client = SchemaRegistryClient({"url": url})
    with open(path) as f:
        schema = Schema(f.read(), "AVRO")
    schema_id = client.register_schema(subject, schema)
    latest = client.get_latest_version(subject)
    if latest.schema_id != schema_id:
        sys.exit("latest version has id %d, registered %d" % (latest.schema_id, schema_id))
    found = client.lookup_schema(subject, schema)
    if found.schema_id != schema_id:
        sys.exit("look-up found id %d, registered %d" % (found.schema_id, schema_id))
    print(schema_id)


def consume(brokers, topic, count, url):
    serializer = MessageSerializer(CachedSchemaRegistryClient({"url": url}))
    consumer = Consumer({
        "bootstrap.servers": brokers,
        "group.id": "python-avro",
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
    })
    consumer.subscribe([topic])
    got = 0
    idle = 0
    while got < count:
        msg = consumer.poll(1.0)
        if msg is None:
            idle += 1
            if idle > 60:
                sys.exit("only %d of %d records within a minute" % (got, count))
            continue
        if msg.error():
            sys.exit("consumer error: %s" % msg.error())
        value = msg.value()
        _, schema_id = struct.unpack(">bI", value[:5])
        record = serializer.decode_message(value)
        key = msg.key().decode() if msg.key() is not None else None
        print(json.dumps({"key": key, "value": record, "schema_id": schema_id}), flush=True)
        got += 1
    consumer.close()


if __name__ == "__main__":
    if sys.argv[1] == "register":
        register(*sys.argv[2:5])
    elif sys.argv[1] == "consume":
        consume(sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5])
    else:
        sys.exit("unknown command %s" % sys.argv[1])
