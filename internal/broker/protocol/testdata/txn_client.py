"""Transactions against the embedded broker with librdkafka (Debian's
python3-confluent-kafka): a committed and an aborted transaction to TOPIC,
then a consume-transform-produce transaction from TOPIC to OUT that
commits the consumer group's offsets with it. Prints one JSON object with
what read_committed and read_uncommitted consumers see, and the group's
committed offset."""

import json
import sys
import uuid

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

bootstrap, topic, out = sys.argv[1], sys.argv[2], sys.argv[3]


def fail(msg):
    print(msg, file=sys.stderr)
    sys.exit(1)


def until_eof(c, what):
    """Yields the messages c polls until the end of its (one) partition;
    fails on a consume error, or when 200 polls bring no end."""
    polls = 0
    while True:
        polls += 1
        if polls > 200:
            fail("no end of %s in sight" % what)
        m = c.poll(0.5)
        if m is None:
            continue
        if m.error():
            if m.error().code() == KafkaError._PARTITION_EOF:
                return
            fail("consume %s: %s" % (what, m.error()))
        yield m


def read(t, isolation):
    c = Consumer({
        "bootstrap.servers": bootstrap,
        "group.id": "reader-" + uuid.uuid4().hex,
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
        "enable.partition.eof": True,
        "isolation.level": isolation,
    })
    c.subscribe([t])
    values = [m.value().decode() for m in until_eof(c, "%s (%s)" % (t, isolation))]
    c.close()
    return values


p = Producer({"bootstrap.servers": bootstrap, "transactional.id": "py-txn", "transaction.timeout.ms": 20000})
p.init_transactions(20)
p.begin_transaction()
for i in range(10):
    p.produce(topic, value="py-commit-%d" % i, key="k%d" % i)
p.commit_transaction(20)
p.begin_transaction()
for i in range(5):
    p.produce(topic, value="py-abort-%d" % i, key="k%d" % i)
p.flush(20)
p.abort_transaction(20)

# Consume-transform-produce: TOPIC's committed records to OUT, with the
# group's offsets in the transaction.
c = Consumer({
    "bootstrap.servers": bootstrap,
    "group.id": "py-group",
    "auto.offset.reset": "earliest",
    "enable.auto.commit": False,
    "enable.partition.eof": True,
    "isolation.level": "read_committed",
})
c.subscribe([topic])
p.begin_transaction()
moved = 0
for m in until_eof(c, topic + " (consume-transform-produce)"):
    p.produce(out, value="out:" + m.value().decode(), key=m.key())
    moved += 1
positions = c.position(c.assignment())
p.send_offsets_to_transaction(positions, c.consumer_group_metadata(), 20)
p.commit_transaction(20)
c.close()

g = Consumer({"bootstrap.servers": bootstrap, "group.id": "py-group"})
committed = g.committed([TopicPartition(topic, 0)], timeout=20)
g.close()

print(json.dumps({
    "committed": read(topic, "read_committed"),
    "uncommitted": read(topic, "read_uncommitted"),
    "out": read(out, "read_committed"),
    "moved": moved,
    "group_offset": committed[0].offset,
}))
