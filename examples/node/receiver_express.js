// A webhook receiver in Express: verifies the Standard Webhooks signature with node:crypto, applies
// each event once by recording its webhook-id with outbox_mark_processed in the transaction that
// updates the balance, and answers 2xx for applied, duplicate and rejected events alike.
// Run: DATABASE_URL=postgresql://billing@db/billing WEBHOOK_SECRET=whsec_... PORT=8000 node receiver_express.js
'use strict';

const crypto = require('node:crypto');
const express = require('express');
const { Pool } = require('pg');

// This service's name in processed_events: each consuming service dedupes in its own namespace.
const CONSUMER = 'billing';
const TOLERANCE_SECONDS = 5 * 60; // older or newer timestamps are refused, as the specification says
const AMOUNT = /^\d{1,8}(\.\d{1,2})?$/;

class Rejected extends Error {} // an event this service will never accept: a retry would fail the same way

// The HMAC key of a `whsec_<base64>` secret.
function signingKey(secret) {
  if (!secret || !secret.startsWith('whsec_')) throw new Error('WEBHOOK_SECRET must be whsec_<base64>');
  return Buffer.from(secret.slice('whsec_'.length), 'base64');
}

// Why the request is not the outbox's (a string), or null when it is: HMAC-SHA256 over
// "<id>.<timestamp>.<raw body>", base64, compared in constant time with each space-separated
// signature (during a secret's rotation the relay sends one per live secret).
function refusal(key, headers, rawBody, nowSeconds) {
  const id = headers['webhook-id'];
  const timestamp = headers['webhook-timestamp'];
  const signatures = headers['webhook-signature'];
  if (!id || !timestamp || !signatures) return 'missing webhook headers';
  if (!/^\d{1,12}$/.test(timestamp)) return 'malformed timestamp';
  if (Math.abs(nowSeconds - Number(timestamp)) > TOLERANCE_SECONDS) return 'timestamp too old or too new';
  const digest = crypto.createHmac('sha256', key).update(`${id}.${timestamp}.`).update(rawBody).digest('base64');
  const expected = Buffer.from(`v1,${digest}`);
  for (const signature of signatures.split(' ')) {
    const given = Buffer.from(signature);
    if (given.length === expected.length && crypto.timingSafeEqual(given, expected)) return null;
  }
  return 'no matching signature';
}

function parseOrderPlaced(event) {
  if (event.type !== 'order.placed') throw new Rejected(`unexpected type ${JSON.stringify(event.type)}`);
  const { customer, total } = event.data ?? {};
  if (typeof customer !== 'string' || customer === '') throw new Rejected('no customer');
  if (typeof total !== 'string' || !AMOUNT.test(total)) throw new Rejected(`total ${JSON.stringify(total)} is not an amount`);
  return { customer, total };
}

// Runs work(client) in a transaction on one pooled connection: COMMIT if it resolves, ROLLBACK if it throws.
async function inTransaction(pool, work) {
  const client = await pool.connect();
  try {
    await client.query('BEGIN');
    const result = await work(client);
    await client.query('COMMIT');
    client.release();
    return result;
  } catch (error) {
    // A connection that cannot even roll back is broken: release(err) discards it from the pool.
    await client.query('ROLLBACK').then(() => client.release(), (rollbackError) => client.release(rollbackError));
    throw error;
  }
}

const key = signingKey(process.env.WEBHOOK_SECRET); // the endpoint's secret, given to this service only
const pool = new Pool({ connectionString: process.env.DATABASE_URL });
const app = express();

// The raw body: the signature covers the bytes as sent, so nothing may parse them first. The limit
// is above outbox.max_payload_bytes (1 MB by default) plus the envelope.
app.post('/webhooks/outbox', express.raw({ type: 'application/json', limit: '2mb' }), async (req, res) => {
  const rawBody = Buffer.isBuffer(req.body) ? req.body : Buffer.alloc(0);
  const why = refusal(key, req.headers, rawBody, Math.floor(Date.now() / 1000));
  if (why) {
    console.warn(`refused a request: ${why}`);
    return res.sendStatus(401);
  }
  // The outbox's event id, the same on every retry and replay: the key to dedupe on, never a
  // business id (one order can have many events). Text, as pg passes bigints.
  const eventId = req.headers['webhook-id'];
  const event = JSON.parse(rawBody.toString('utf8'));

  // One transaction: the mark and the effect commit together, so a crash between them cannot
  // leave an event applied but unmarked (applied again on redelivery) or marked but unapplied.
  const outcome = await inTransaction(pool, async (db) => {
    const { rows: [{ first }] } = await db.query('SELECT outbox.outbox_mark_processed($1::bigint, $2::text) AS first', [eventId, CONSUMER]);
    if (!first) return 'duplicate';
    let order;
    try {
      order = parseOrderPlaced(event);
    } catch (error) {
      if (!(error instanceof Rejected)) throw error;
      await db.query('INSERT INTO rejected_events (event_id, reason) VALUES ($1, $2)', [eventId, error.message]);
      return `rejected (${error.message})`;
    }
    await db.query(
      'INSERT INTO balances (customer, total) VALUES ($1, $2) ON CONFLICT (customer) DO UPDATE SET total = balances.total + excluded.total',
      [order.customer, order.total],
    );
    return 'applied';
  });
  console.log(`event ${eventId}: ${outcome}`);
  // 2xx in all three cases. The relay retries any other status (4xx included) until the
  // endpoint's attempt cap, then marks the delivery dead: a duplicate was applied already, and a
  // rejected event would fail the same way every time, so it is recorded here for a person to
  // look at rather than burning retries. An unexpected error (the database is down) rejects:
  // Express answers 500, retried with backoff, which is what a transient failure wants.
  return res.sendStatus(204);
});

const server = app.listen(Number(process.env.PORT), '127.0.0.1', (error) => {
  if (error) throw error; // e.g. the port is taken: exit, with the error
  console.log(`listening on 127.0.0.1:${server.address().port}`);
});
