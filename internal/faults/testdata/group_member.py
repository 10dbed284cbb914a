"""One member of a consumer group, for TestGroupsSurviveARelayRestart.

Reads topic "orders" slowly through librdkafka (python3-confluent-kafka),
commits synchronously after each poll, and when it has run for the given
seconds writes what happened as JSON: the wall-clock times of its
assignments and revocations, its commit errors, and how many times each
relay-event-id was delivered to it.
"""
import json
import sys
import time

from confluent_kafka import Consumer, KafkaException

addr, group, seconds, out = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
state = {"assigned": [], "revoked": [], "commit_errors": [], "ids": {}, "closing": 0}


def on_assign(consumer, partitions):
    state["assigned"].append(time.time())


def on_revoke(consumer, partitions):
    state["revoked"].append(time.time())


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
c.subscribe(["orders"], on_assign=on_assign, on_revoke=on_revoke, on_lost=on_revoke)
deadline = time.time() + seconds
while time.time() < deadline:
    msgs = c.consume(10, 0.5)
    got = False
    for m in msgs:
        if m.error():
            continue
        got = True
        for k, v in m.headers() or []:
            if k == "relay-event-id":
                i = v.decode()
                state["ids"][i] = state["ids"].get(i, 0) + 1
    if got:
        try:
            c.commit(asynchronous=False)
        except KafkaException as e:
            state["commit_errors"].append([time.time(), str(e)])
    time.sleep(0.2)
state["closing"] = time.time()  # close() revokes the assignment: not a rebalance
c.close()
with open(out, "w") as f:
    json.dump(state, f)
