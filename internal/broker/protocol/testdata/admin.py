"""An admin client of the ecosystem against the listener: Debian's
python3-confluent-kafka (librdkafka) lists topics, describes and alters a
topic's configs, reads a consumer group's lag the way lag exporters do
(committed offsets against the high watermarks), and deletes a topic.
Prints one JSON object. Usage: admin.py BOOTSTRAP TOPIC GROUP DELETE_TOPIC"""
import json
import sys

from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource

bootstrap, topic, group, doomed = sys.argv[1:5]
admin = AdminClient({"bootstrap.servers": bootstrap})
out = {}

md = admin.list_topics(timeout=10)
out["topics"] = sorted(md.topics)
partitions = sorted(md.topics[topic].partitions)


def describe():
    res = ConfigResource(ConfigResource.Type.TOPIC, topic)
    entries = admin.describe_configs([res])[res].result(timeout=10)
    return {k: v.value for k, v in entries.items()}


out["configs"] = describe()
current = out["configs"]
res = ConfigResource(ConfigResource.Type.TOPIC, topic, set_config={"retention.ms": "3600000", "cleanup.policy": current["cleanup.policy"]})
admin.alter_configs([res])[res].result(timeout=10)
out["configs_after"] = describe()

consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
committed = consumer.committed([TopicPartition(topic, p) for p in partitions], timeout=10)
lag = {}
for tp in committed:
    low, high = consumer.get_watermark_offsets(tp, timeout=10)
    lag[str(tp.partition)] = high - max(tp.offset, low)
consumer.close()
out["lag"] = lag

admin.delete_topics([doomed], operation_timeout=10)[doomed].result(timeout=10)
out["after_delete"] = sorted(admin.list_topics(timeout=10).topics)
print(json.dumps(out))
