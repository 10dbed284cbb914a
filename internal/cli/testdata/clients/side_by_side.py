"""One Python Kafka client of TestClientsSideBySide (internal/cli): reads
N records of TOPIC from the start in consumer group GROUP and prints
{"read": n}. CLIENT is kafka-python (Debian's python3-kafka) or
confluent-kafka (python3-confluent-kafka, librdkafka).
Usage: side_by_side.py CLIENT BOOTSTRAP TOPIC GROUP N"""
import json
import sys
import time

client, bootstrap, topic, group, want = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
deadline = time.monotonic() + 50
got = 0
if client == "kafka-python":
    from kafka import KafkaConsumer

    c = KafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=group, auto_offset_reset="earliest",
                      enable_auto_commit=False, consumer_timeout_ms=1000)
    while got < want and time.monotonic() < deadline:
        for _ in c:
            got += 1
            if got >= want:
                break
    c.close()
elif client == "confluent-kafka":
    from confluent_kafka import Consumer

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "earliest",
                  "enable.auto.commit": False})
    c.subscribe([topic])
    while got < want and time.monotonic() < deadline:
        m = c.poll(1.0)
        if m is None:
            continue
        if m.error():
            raise SystemExit(f"confluent-kafka: {m.error()}")
        got += 1
    c.close()
else:
    raise SystemExit(f"unknown client {client}")
print(json.dumps({"read": got}))
