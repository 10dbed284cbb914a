// A kafkajs consumer group member for internal/broker/protocol's
// TestKafkajsGroupAcrossBrokerRestart:
//
//   node kafkajs_group.js BROKERS TOPIC GROUP CLIENT_ID
//
// prints "record VALUE" for each record it processes, "committed" lines
// after each commit the broker accepted ("commit-error CODE" for one it
// refused), "joined GENERATION" on every group join, and "error MESSAGE"
// for anything else; it runs until killed. kafkajs is installed by
// .ci/run (internal/registry/testdata/clients).
'use strict';
const { Kafka, logLevel } = require('kafkajs');

async function main() {
  const [brokers, topic, group, clientId] = process.argv.slice(2);
  const kafka = new Kafka({
    clientId, brokers: brokers.split(','), logLevel: process.env.KJS_DEBUG ? logLevel.INFO : logLevel.NOTHING,
    retry: { initialRetryTime: 100, maxRetryTime: 1000, retries: 1000 },
  });
  const consumer = kafka.consumer({ groupId: group, sessionTimeout: 10000, heartbeatInterval: 500, retry: { retries: 1000 } });
  consumer.on(consumer.events.GROUP_JOIN, (e) => console.log(`joined ${e.payload.groupId} ${e.payload.memberId} ${JSON.stringify(e.payload.memberAssignment)}`));
  consumer.on(consumer.events.COMMIT_OFFSETS, () => console.log('committed'));
  consumer.on(consumer.events.CRASH, (e) => console.log(`error crash ${e.payload.error && e.payload.error.message}`));
  await consumer.connect();
  await consumer.subscribe({ topic, fromBeginning: true });
  await consumer.run({
    autoCommitInterval: 200,
    eachMessage: async ({ message }) => { console.log(`record ${message.value.toString()}`); },
  });
}

main().catch((e) => { console.log(`error ${e.message}`); process.exit(1); });
