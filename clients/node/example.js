'use strict';
// The test program of clients/conformance.py:
//   node example.js enqueue-and-rollback TOPIC
//   node example.js work        (configured by DATABASE_URL, OUTBOX_ENDPOINT, BEHAVIOUR, ...)

const { setTimeout: sleep } = require('node:timers/promises');
const pg = require('pg');
const { runWorker } = require('./outbox-worker');

const env = process.env;

// One line per event; stdout to a pipe is written synchronously on Linux, so nothing waits in a buffer.
const say = (line) => process.stdout.write(`${line}\n`);

async function enqueueAndRollback(topic) {
  const client = new pg.Client({ connectionString: env.DATABASE_URL });
  await client.connect();
  try {
    await client.query('BEGIN');
    await client.query(`SELECT outbox_enqueue($1, '{"rolled_back": true}')`, [topic]);
    await client.query('ROLLBACK');
  } finally {
    await client.end();
  }
}

function work() {
  const name = env.WORKER_NAME ?? 'node';
  const handleMs = Number(env.HANDLE_MS ?? 0);
  const behaviour = env.BEHAVIOUR ?? 'apply';

  async function handler(client, job) {
    if (behaviour === 'fail') throw new Error('always fails');
    if (behaviour === 'none') return; // the benchmark's handler
    if (handleMs > 0) await sleep(handleMs);
    await client.query('INSERT INTO client_effects (event_id, worker) VALUES ($1, $2)', [job.event_id, name]);
  }

  const worker = runWorker({
    connectionString: env.DATABASE_URL,
    endpoint: env.OUTBOX_ENDPOINT,
    consumer: env.OUTBOX_CONSUMER || undefined,
    handler,
    handlers: Number(env.HANDLERS ?? 4),
    lease: env.LEASE ?? '30 seconds',
    pollMs: Number(env.POLL_MS ?? 1000),
    graceMs: Number(env.GRACE_MS ?? 10000),
    schema: env.OUTBOX_SCHEMA || 'public',
  });
  for (const outcome of ['handled', 'duplicate', 'nacked', 'lost']) {
    worker.on(outcome, (job) => say(`${outcome} ${job.event_id} ${job.attempt}`));
  }
  for (const moment of ['ready', 'stopping', 'stopped']) worker.on(moment, () => say(moment));
}

const [command, topic] = process.argv.slice(2);
if (command === 'enqueue-and-rollback' && topic) {
  enqueueAndRollback(topic).catch((err) => { console.error(err.message); process.exit(1); });
} else if (command === 'work') {
  work();
} else {
  console.error('usage: node example.js enqueue-and-rollback TOPIC | work');
  process.exit(2);
}
