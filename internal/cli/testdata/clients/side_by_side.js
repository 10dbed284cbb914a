// One kafkajs client of TestClientsSideBySide (internal/cli): reads N
// records of TOPIC from the start in consumer group GROUP, and prints
// {"read": n}.
// Usage: node side_by_side.js BOOTSTRAP TOPIC GROUP N
const { Kafka, logLevel } = require("kafkajs");

const [bootstrap, topic, group, wantArg] = process.argv.slice(2);
const want = Number(wantArg);

async function main() {
  const kafka = new Kafka({ clientId: "side-by-side", brokers: [bootstrap], logLevel: logLevel.ERROR });
  const consumer = kafka.consumer({ groupId: group });
  await consumer.connect();
  await consumer.subscribe({ topic, fromBeginning: true });
  let read = 0;
  const done = new Promise((resolve) => {
    consumer.run({
      autoCommit: false,
      eachMessage: async () => {
        read++;
        if (read >= want) resolve();
      },
    });
  });
  // The timer is cleared once done: a pending one would keep node running
  // for the whole 50 s after the records are read.
  let timer;
  await Promise.race([done, new Promise((resolve) => (timer = setTimeout(resolve, 50000)))]);
  clearTimeout(timer);
  await consumer.disconnect();
  console.log(JSON.stringify({ read }));
}

main().catch((err) => {
  console.error(`kafkajs: ${err.stack || err}`);
  process.exit(1);
});
