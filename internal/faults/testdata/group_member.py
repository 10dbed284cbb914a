"""One member of a consumer group, for TestGroupsSurviveARelayRestart.

Usage: group_member.py CLIENT ADDR GROUP SECONDS OUT, CLIENT being
"librdkafka" (python3-confluent-kafka) or "kafka-python" (python3-kafka).

Reads topic "orders" slowly, commits synchronously after each poll, and
when it has run for SECONDS writes what happened as JSON to OUT: the
wall-clock times of its assignments and revocations, its commit errors,
how many times each relay-event-id was delivered to it, and when it began
to close (closing revokes its partitions: not a rebalance).
"""
import json
import sys
import time

client, addr, group, seconds, out = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4]), sys.argv[5]
state = {"assigned": [], "revoked": [], "commit_errors": [], "ids": {}, "closing": 0}


def saw(headers):
    for k, v in headers or []:
        if k == "relay-event-id":
            i = v.decode()
            state["ids"][i] = state["ids"].get(i, 0) + 1


def librdkafka():
    from confluent_kafka import Consumer, KafkaException

    c = Consumer({
        "log_level": 3,
        "bootstrap.servers": addr,
        "group.id": group,
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
        "session.timeout.ms": 30000,
        "fetch.max.bytes": 16384,
        "message.max.bytes": 16384,
        "max.partition.fetch.bytes": 4096,
        "partition.assignment.strategy": "range",
    })
    c.subscribe(["orders"],
                on_assign=lambda *_: state["assigned"].append(time.time()),
                on_revoke=lambda *_: state["revoked"].append(time.time()),
                on_lost=lambda *_: state["revoked"].append(time.time()))
    deadline = time.time() + seconds
    while time.time() < deadline:
        msgs = [m for m in c.consume(10, 0.5) if not m.error()]
        for m in msgs:
            saw(m.headers())
        if msgs:
            try:
                c.commit(asynchronous=False)
            except KafkaException as e:
                state["commit_errors"].append([time.time(), str(e)])
        time.sleep(0.2)
    state["closing"] = time.time()
    c.close()


def kafka_python():
    from kafka import KafkaConsumer, ConsumerRebalanceListener
    from kafka.coordinator.assignors.range import RangePartitionAssignor

    class Listener(ConsumerRebalanceListener):
        def on_partitions_revoked(self, revoked):
            state["revoked"].append(time.time())

        def on_partitions_assigned(self, assigned):
            state["assigned"].append(time.time())

    c = KafkaConsumer(bootstrap_servers=addr, group_id=group, enable_auto_commit=False,
                      auto_offset_reset="earliest", session_timeout_ms=30000,
                      max_partition_fetch_bytes=4096, fetch_max_bytes=16384,
                      partition_assignment_strategy=[RangePartitionAssignor])
    c.subscribe(["orders"], listener=Listener())
    deadline = time.time() + seconds
    while time.time() < deadline:
        batch = c.poll(timeout_ms=500, max_records=10)
        n = 0
        for recs in batch.values():
            for r in recs:
                saw(r.headers)
                n += 1
        if n:
            try:
                c.commit()
            except Exception as e:
                state["commit_errors"].append([time.time(), repr(e)])
        time.sleep(0.2)
    state["closing"] = time.time()
    c.close()


{"librdkafka": librdkafka, "kafka-python": kafka_python}[client]()
with open(out, "w") as f:
    json.dump(state, f)
