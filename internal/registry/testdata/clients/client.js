// Drives kafkajs and @kafkajs/confluent-schema-registry against the
// relay's embedded schema registry and broker, for
// internal/registry/clients_test.go.
//
//   node client.js register URL SUBJECT TYPE SCHEMA_FILE   prints the id
//   node client.js consume BROKERS TOPIC COUNT URL         consumes COUNT
//       records from the start of TOPIC, decodes each value through the
//       registry, prints one JSON object per line: {key, value, schema_id}
'use strict';
const fs = require('fs');
const { Kafka, logLevel } = require('kafkajs');
const { SchemaRegistry, SchemaType } = require('@kafkajs/confluent-schema-registry');

async function register(url, subject, type, path) {
  const registry = new SchemaRegistry({ host: url });
  const schema = fs.readFileSync(path, 'utf8');
  const { id } = await registry.register({ type: SchemaType[type], schema }, { subject });
  const latest = await registry.getLatestSchemaId(subject);
  if (latest !== id) throw new Error(`latest id ${latest}, registered ${id}`);
  const byVersion = await registry.getRegistryId(subject, 'latest');
  if (byVersion !== id) throw new Error(`version latest has id ${byVersion}, registered ${id}`);
  const bySchema = await registry.getRegistryIdBySchema(subject, { type: SchemaType[type], schema });
  if (bySchema !== id) throw new Error(`look-up found id ${bySchema}, registered ${id}`);
  console.log(id);
}

async function consume(brokers, topic, count, url) {
  const registry = new SchemaRegistry({ host: url });
  const kafka = new Kafka({ clientId: 'node-registry', brokers: brokers.split(','), logLevel: logLevel.ERROR });
  const consumer = kafka.consumer({ groupId: 'node-registry' });
  await consumer.connect();
  await consumer.subscribe({ topic, fromBeginning: true });
  let got = 0;
  const timer = setTimeout(() => { console.error(`only ${got} of ${count} records within a minute`); process.exit(1); }, 60000);
  await new Promise((resolve, reject) => {
    consumer.run({
      eachMessage: async ({ message }) => {
        const value = await registry.decode(message.value);
        const schemaId = message.value.readUInt32BE(1);
        console.log(JSON.stringify({ key: message.key ? message.key.toString() : null, value, schema_id: schemaId }));
        got++;
        if (got >= count) resolve();
      },
    }).catch(reject);
  });
  clearTimeout(timer);
  await consumer.disconnect();
}

const [cmd, ...args] = process.argv.slice(2);
const run = cmd === 'register' ? register(...args) : cmd === 'consume' ? consume(args[0], args[1], Number(args[2]), args[3]) : Promise.reject(new Error(`unknown command ${cmd}`));
run.then(() => process.exit(0), (err) => { console.error(err && err.stack || err); process.exit(1); });
