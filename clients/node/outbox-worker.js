'use strict';
/**
 * outbox-worker: a pull consumer for outbox_ext, one file, no framework, on `pg`.
 *
 *   const { Worker, runWorker } = require('./outbox-worker');
 *
 *   const worker = new Worker({
 *     connectionString,          // e.g. 'postgresql://postgres@127.0.0.1:5432/postgres'
 *     endpoint,                  // a pull endpoint (outbox_endpoint_set(..., kind => 'pull'))
 *     handler,                   // async (client, job) => {}: runs inside a transaction on `client`
 *     handlers: 4,               // concurrent handlers, each with its own connection
 *     consumer: endpoint,        // name for outbox_mark_processed
 *     lease: '30 seconds',       // interval text passed to outbox_claim
 *     pollMs: 1000,              // wait at most this long for a NOTIFY after an empty claim
 *     graceMs: 10000,            // on stop, how long in-flight handlers may take to finish
 *     log: (message) => {},      // connection and database trouble (default: stderr)
 *     schema: 'public',          // the schema outbox_ext was installed in: calls name it, so no
 *                                // other schema's function of the same name can be called instead
 *   });
 *   worker.on('handled' | 'duplicate' | 'nacked' | 'lost', (job) => {});  // 'lost': ack or nack
 *                                // found the claim gone (lease ran out, another consumer took it)
 *   worker.on('ready' | 'stopping' | 'stopped', () => {});
 *   await worker.start();        // resolves once stopped
 *   await worker.stop();         // stop claiming, let in-flight jobs finish (up to graceMs), close
 *
 *   runWorker(options)           // a Worker started at once that stops on SIGTERM/SIGINT and then
 *                                // exits with status 0; returns the Worker (attach listeners first
 *                                // thing: nothing is emitted before the first claim).
 *
 * `job` is the row of outbox_claim: { event_id (string: an int8), topic, payload, key, attempt,
 * created_at }. The handler gets the job's own pg.Client with a transaction open: run the effect's
 * statements on it and do not COMMIT or ROLLBACK yourself. The worker commits the effect together
 * with outbox_mark_processed and outbox_ack, or rolls all three back: if the handler throws, the
 * job is nacked (the extension's backoff, dead at the endpoint's max_attempts); if the ack says the
 * claim was lost (the lease ran out and another consumer took the job), nothing is kept.
 */

const { EventEmitter } = require('node:events');
const pg = require('pg');

const FIRST_BACKOFF_MS = 100;
const MAX_BACKOFF_MS = 5000;

class Worker extends EventEmitter {
  #options;
  #sql;                 // the statements, their functions named by the schema
  #slots;
  #claimer = null;      // the connection that claims and LISTENs
  #notified = true;     // a NOTIFY came (or we never claimed): the next empty wait returns at once
  #stopping = false;
  #waiters = new Set(); // resolve functions of the pending #waitUntil calls
  #loop = null;
  #stopped = null;
  #inFlight = new Set();

  constructor(options) {
    super();
    const { connectionString, endpoint, handler } = options;
    if (!endpoint || typeof handler !== 'function') throw new TypeError('Worker needs an endpoint and a handler function');
    this.#options = {
      connectionString,
      endpoint,
      handler,
      handlers: options.handlers ?? 4,
      consumer: options.consumer ?? endpoint,
      lease: options.lease ?? '30 seconds',
      pollMs: options.pollMs ?? 1000,
      graceMs: options.graceMs ?? 10000,
      log: options.log ?? ((message) => console.error(`outbox-worker: ${message}`)),
    };
    // Each call names the extension's schema and casts its arguments to the declared types (pg
    // sends them untyped): so neither a function of the same name elsewhere on the search_path
    // nor a looser overload can be called instead.
    const schema = pg.escapeIdentifier(options.schema ?? 'public');
    this.#sql = {
      claim: 'SELECT event_id, topic, payload, key, attempt, created_at'
        + ` FROM ${schema}.outbox_claim($1::text, $2::integer, $3::interval)`,
      mark: `SELECT ${schema}.outbox_mark_processed($1::bigint, $2::text) AS fresh`,
      ack: `SELECT ${schema}.outbox_ack($1::text, $2::bigint, $3::integer) AS acked`,
      nack: `SELECT ${schema}.outbox_nack($1::text, $2::bigint, $3::integer, $4::text) AS nacked`,
    };
    if (!(this.#options.handlers >= 1 && this.#options.handlers <= 1000)) {
      throw new RangeError('handlers must be between 1 and 1000 (the most outbox_claim hands out at once)');
    }
    this.#newClient('check').removeAllListeners();  // a malformed connection string throws here, not in a retry loop
    this.#slots = Array.from({ length: this.#options.handlers }, (_, index) => ({
      index, client: null, busy: false, connecting: false, backoffMs: FIRST_BACKOFF_MS,
    }));
  }

  /** Connects and claims until stop(); resolves once stopped. */
  start() {
    if (!this.#loop) {
      for (const slot of this.#slots) this.#reconnectSlot(slot);
      this.#loop = this.#claimLoop();
    }
    return this.#loop.then(() => this.#stopped);
  }

  /** Stops claiming at once, waits up to graceMs for the jobs in flight, closes the connections. */
  stop() {
    if (!this.#stopped) {
      this.#stopping = true;
      this.emit('stopping');
      this.#wake();
      this.#stopped = this.#shutDown();
    }
    return this.#stopped;
  }

  async #shutDown() {
    const deadline = Date.now() + this.#options.graceMs;
    // A claim already sent when the stop came still hands its jobs out (they are ours now),
    // so wait for the loop first, then for every job it started.
    await withDeadline(this.#loop ?? Promise.resolve(), deadline);
    await withDeadline(Promise.allSettled([...this.#inFlight]), deadline);
    // Jobs still running lose their connection here; their leases bring them back.
    const clients = [this.#claimer, ...this.#slots.map((slot) => slot.client)].filter(Boolean);
    this.#claimer = null;
    for (const slot of this.#slots) slot.client = null;
    await withDeadline(Promise.allSettled(clients.map((client) => client.end())), Date.now() + 1000);
    this.emit('stopped');
  }

  async #claimLoop() {
    const { endpoint, lease, pollMs } = this.#options;
    let backoffMs = FIRST_BACKOFF_MS;
    let ready = false;
    while (!this.#stopping) {
      // Claim only as many jobs as there are free handlers, so none waits on us with its lease running.
      await this.#waitUntil(() => this.#freeSlots().length > 0);
      if (this.#stopping) break;
      try {
        if (!this.#claimer) this.#claimer = await this.#connectClaimer();
        const free = this.#freeSlots();
        this.#notified = false;  // anything NOTIFYed from here on may not be in this claim's result
        const { rows } = await this.#claimer.query(this.#sql.claim, [endpoint, free.length, lease]);
        backoffMs = FIRST_BACKOFF_MS;
        if (!ready) { ready = true; this.emit('ready'); }
        // Recounted: a handler connection may have dropped while we claimed.
        const slots = this.#freeSlots();
        rows.forEach((job, i) => {
          if (slots[i]) this.#startJob(slots[i], job);
          else this.#options.log(`event ${job.event_id} attempt ${job.attempt}: no handler connection; left to its lease`);
        });
        // Empty: sleep until a NOTIFY (LISTEN is on this connection) or the poll interval.
        if (rows.length === 0) await this.#waitUntil(() => this.#notified, pollMs);
      } catch (err) {
        if (this.#stopping) break;
        this.#options.log(`claiming from ${endpoint}: ${oneLine(err)}; reconnecting in ${backoffMs} ms`);
        this.#dropClaimer();
        await this.#waitUntil(() => false, backoffMs);
        backoffMs = Math.min(backoffMs * 2, MAX_BACKOFF_MS);
      }
    }
  }

  async #connectClaimer() {
    const client = this.#newClient('claim');
    // A lost connection wakes the loop so it reconnects now rather than after the poll interval,
    // and claims at once: NOTIFYs sent meanwhile were missed.
    client.on('error', () => {
      if (this.#claimer !== client) return;
      this.#dropClaimer();
      this.#notified = true;
      this.#wake();
    });
    client.on('notification', () => { this.#notified = true; this.#wake(); });
    try {
      await client.connect();
      // The channel has a dot in it, hence the quoted identifier.
      await client.query(`LISTEN ${client.escapeIdentifier(`outbox.${this.#options.endpoint}`)}`);
    } catch (err) {
      client.end().catch(() => {});
      throw err;
    }
    return client;
  }

  #dropClaimer() {
    const client = this.#claimer;
    this.#claimer = null;
    if (client) client.end().catch(() => {});
  }

  #freeSlots() {
    return this.#slots.filter((slot) => slot.client && !slot.busy && !slot.connecting);
  }

  #startJob(slot, job) {
    slot.busy = true;
    const running = this.#runJob(slot, job).finally(() => {
      slot.busy = false;
      this.#inFlight.delete(running);
      if (!slot.client) this.#reconnectSlot(slot);
      this.#wake();
    });
    this.#inFlight.add(running);
  }

  // Never rejects: a failure of the database or of the connection is logged, the connection
  // replaced, and the job left to its lease.
  async #runJob(slot, job) {
    const client = slot.client;
    let outcome;
    try {
      outcome = await this.#process(client, job);
      slot.backoffMs = FIRST_BACKOFF_MS;
    } catch (err) {
      if (!this.#stopping) {
        this.#options.log(`event ${job.event_id} attempt ${job.attempt}: ${oneLine(err)}; left to its lease, reconnecting`);
      }
      // Whatever state the session is in, a fresh connection is the safe one.
      if (slot.client === client) slot.client = null;
      client.end().catch(() => {});
      return;
    }
    try {
      this.emit(outcome, job);
    } catch (err) {
      this.#options.log(`a '${outcome}' listener threw: ${oneLine(err)}`);
    }
  }

  // The effect, the processed mark and the ack commit together or not at all.
  async #process(client, job) {
    const { endpoint, consumer, handler } = this.#options;
    await client.query('BEGIN');
    try {
      const { rows: [{ fresh }] } = await client.query(this.#sql.mark, [job.event_id, consumer]);
      if (fresh) await handler(client, job);
      const { rows: [{ acked }] } = await client.query(this.#sql.ack, [endpoint, job.event_id, job.attempt]);
      if (!acked) {
        // Our lease ran out and another consumer claimed the job: it will apply the effect.
        await client.query('ROLLBACK');
        return 'lost';
      }
      await client.query('COMMIT');
      return fresh ? 'handled' : 'duplicate';
    } catch (err) {
      // The handler (or COMMIT) failed. If the connection is gone, this ROLLBACK throws
      // and the caller leaves the job to its lease; otherwise record the failure.
      await client.query('ROLLBACK');
      const { rows: [{ nacked }] } = await client.query(
        this.#sql.nack, [endpoint, job.event_id, job.attempt, oneLine(err)]);
      return nacked ? 'nacked' : 'lost';
    }
  }

  async #reconnectSlot(slot) {
    if (slot.connecting) return;
    slot.connecting = true;
    while (!this.#stopping) {
      const client = this.#newClient(`handler ${slot.index}`);
      // An idle connection that dies is replaced at once; a busy one when its job ends.
      client.on('error', () => {
        if (slot.client !== client) return;
        slot.client = null;
        if (!slot.busy) this.#reconnectSlot(slot);
      });
      try {
        await client.connect();
        if (this.#stopping) { client.end().catch(() => {}); break; }
        slot.client = client;
        break;
      } catch (err) {
        client.end().catch(() => {});
        this.#options.log(`handler ${slot.index} connecting: ${oneLine(err)}; retrying in ${slot.backoffMs} ms`);
        await this.#waitUntil(() => false, slot.backoffMs);
        slot.backoffMs = Math.min(slot.backoffMs * 2, MAX_BACKOFF_MS);
      }
    }
    slot.connecting = false;
    this.#wake();
  }

  #newClient(role) {
    const client = new pg.Client({
      connectionString: this.#options.connectionString,
      application_name: `outbox-worker ${this.#options.endpoint} ${role}`,
      keepAlive: true,  // so a half-open connection is noticed
    });
    // pg emits 'error' when a connection drops; unheard, it would crash the process.
    client.on('error', (err) => { if (!this.#stopping) this.#options.log(`${role} connection: ${oneLine(err)}`); });
    return client;
  }

  // Something changed (a NOTIFY, a free handler, a lost connection, stop): every wait re-checks.
  #wake() {
    for (const resolve of this.#waiters) resolve();
    this.#waiters.clear();
  }

  // Resolves when condition() holds, on stop, or after timeoutMs. A wake may concern another
  // waiter, hence the loop.
  async #waitUntil(condition, timeoutMs = Infinity) {
    const deadline = Date.now() + timeoutMs;
    while (!condition() && !this.#stopping && Date.now() < deadline) {
      let timer, wakeUp;
      await new Promise((resolve) => {
        wakeUp = resolve;
        this.#waiters.add(resolve);
        if (Number.isFinite(timeoutMs)) timer = setTimeout(resolve, deadline - Date.now());
      });
      clearTimeout(timer);
      this.#waiters.delete(wakeUp);
    }
  }
}

function runWorker(options) {
  const worker = new Worker(options);
  const stop = () => worker.stop().then(() => process.exit(0));
  process.on('SIGTERM', stop);
  process.on('SIGINT', stop);
  worker.start();  // never rejects: database trouble is logged and retried
  return worker;
}

function withDeadline(promise, deadline) {
  let timer;
  const timeout = new Promise((resolve) => { timer = setTimeout(resolve, Math.max(0, deadline - Date.now())); });
  return Promise.race([promise, timeout]).finally(() => clearTimeout(timer));
}

function oneLine(err) {
  const message = err instanceof Error ? err.message : String(err);
  return message.replace(/\s+/g, ' ').trim() || 'error without a message';
}

module.exports = { Worker, runWorker };
