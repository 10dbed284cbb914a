// One kafkajs member of a consumer group, for internal/faults'
// TestGroupsSurviveARelayRestart; the same contract as group_member.py.
//
//   node group_member.js ADDR GROUP SECONDS OUT
//
// Reads topic "orders" slowly, commits after each batch, and when it has
// run for SECONDS writes what happened as JSON to OUT: the wall-clock
// times (seconds) of its assignments (every join of a generation) and
// revocations (none in kafkajs: a rebalance shows as a join), its commit
// errors, how many times each relay-event-id was delivered to it, and
// when it began to close.
'use strict';
const fs = require('fs');
const { Kafka, logLevel, AssignerProtocol: { MemberMetadata, MemberAssignment } } = require('kafkajs');

const [addr, group, seconds, out] = process.argv.slice(2);
const state = { assigned: [], revoked: [], commit_errors: [], ids: {}, closing: 0 };
const now = () => Date.now() / 1000;
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// rangeAssigner is Kafka's range strategy under its name, "range", which
// the group's librdkafka and kafka-python members offer (kafkajs ships only
// its own round robin, under a name no other client offers): per topic,
// the members in member-id order take contiguous runs of partitions, the
// first ones one more when the count does not divide.
const rangeAssigner = ({ cluster }) => ({
  name: 'range',
  version: 0,
  async assign({ members, topics }) {
    const assignment = {};
    for (const { memberId } of members) assignment[memberId] = {};
    for (const topic of topics) {
      const subscribed = members
        .filter((m) => MemberMetadata.decode(m.memberMetadata).topics.includes(topic))
        .map((m) => m.memberId)
        .sort();
      const partitions = cluster.findTopicPartitionMetadata(topic).map((p) => p.partitionId).sort((a, b) => a - b);
      const per = Math.floor(partitions.length / subscribed.length);
      const extra = partitions.length % subscribed.length;
      let next = 0;
      subscribed.forEach((id, i) => {
        const n = per + (i < extra ? 1 : 0);
        assignment[id][topic] = partitions.slice(next, next + n);
        next += n;
      });
    }
    return Object.keys(assignment).map((memberId) => ({
      memberId,
      memberAssignment: MemberAssignment.encode({ version: this.version, assignment: assignment[memberId] }),
    }));
  },
  protocol({ topics }) {
    return { name: this.name, metadata: MemberMetadata.encode({ version: this.version, topics }) };
  },
});

async function main() {
  const kafka = new Kafka({
    clientId: 'relay-faults-kafkajs', brokers: [addr], logLevel: logLevel.ERROR,
    retry: { retries: 1000, initialRetryTime: 100, maxRetryTime: 1000 },
  });
  const consumer = kafka.consumer({
    groupId: group, sessionTimeout: 30000, heartbeatInterval: 1000, partitionAssigners: [rangeAssigner],
    maxBytesPerPartition: 4096, maxBytes: 16384, retry: { retries: 1000, initialRetryTime: 100, maxRetryTime: 1000 },
  });
  consumer.on(consumer.events.GROUP_JOIN, () => state.assigned.push(now()));
  await consumer.connect();
  await consumer.subscribe({ topic: 'orders', fromBeginning: true });
  await consumer.run({
    autoCommit: false,
    eachBatchAutoResolve: false,
    eachBatch: async ({ batch, resolveOffset, heartbeat, isRunning, isStale }) => {
      const msgs = batch.messages.slice(0, 10);
      for (const m of msgs) {
        if (!isRunning() || isStale()) return;
        const id = m.headers && m.headers['relay-event-id'];
        if (id) {
          const k = id.toString();
          state.ids[k] = (state.ids[k] || 0) + 1;
        }
        resolveOffset(m.offset);
      }
      if (msgs.length > 0) {
        const next = (BigInt(msgs[msgs.length - 1].offset) + 1n).toString();
        try {
          await consumer.commitOffsets([{ topic: batch.topic, partition: batch.partition, offset: next }]);
        } catch (e) {
          state.commit_errors.push([now(), String(e)]);
        }
      }
      await heartbeat().catch(() => {});
      await sleep(200);
    },
  });
  await sleep(Number(seconds) * 1000);
  state.closing = now();
  await consumer.disconnect();
}

main().then(() => {
  fs.writeFileSync(out, JSON.stringify(state));
  process.exit(0);
}, (e) => {
  console.error(e);
  process.exit(1);
});
