// The @platformatic/kafka client of TestClientsSideBySide (internal/cli):
// produces N keyed records to TOPIC (created on first use), then reads
// them from the start in consumer group GROUP, and prints
// {"produced": n, "read": n}.
// Usage: node side_by_side_platformatic.mjs BOOTSTRAP TOPIC GROUP N
import { Consumer, MessagesStreamModes, Producer, stringDeserializers, stringSerializers } from "@platformatic/kafka";

const [bootstrap, topic, group, wantArg] = process.argv.slice(2);
const want = Number(wantArg);
const bootstrapBrokers = [bootstrap];

async function main() {
  const producer = new Producer({ clientId: "side-by-side", bootstrapBrokers, serializers: stringSerializers, autocreateTopics: true });
  const messages = [];
  for (let i = 0; i < want; i++) messages.push({ topic, key: `k${i}`, value: `v${i}` });
  await producer.send({ messages });
  await producer.close();

  const consumer = new Consumer({ clientId: "side-by-side", groupId: group, bootstrapBrokers, deserializers: stringDeserializers });
  const stream = await consumer.consume({ topics: [topic], mode: MessagesStreamModes.EARLIEST, autocommit: false });
  let read = 0;
  const timeout = setTimeout(() => stream.close(), 50000);
  for await (const message of stream) {
    if (message.value.startsWith("v")) read++;
    if (read >= want) break;
  }
  clearTimeout(timeout);
  await stream.close();
  await consumer.close(true);
  console.log(JSON.stringify({ produced: want, read }));
}

// describe prints an error with the errors it aggregates and their causes.
function describe(err, depth = 0) {
  const inner = [...(err.errors || []), ...(err.cause ? [err.cause] : [])];
  return [`${"  ".repeat(depth)}${err.stack || err}`, ...inner.map((e) => describe(e, depth + 1))].join("\n");
}

main().catch((err) => {
  console.error(`@platformatic/kafka: ${describe(err)}`);
  process.exit(1);
});
