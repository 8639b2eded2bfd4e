// Enqueue from Knex: the order insert and outbox_enqueue run on the transaction's connection, so
// both commit or roll back together; outbox_enqueue returns the event id, which receivers get as
// webhook-id. The second order's payment is declined after both were written: nothing is left.
// Run: DATABASE_URL=postgresql://app@db/shop node knex_enqueue.js
'use strict';

const knex = require('knex')({ client: 'pg', connection: process.env.DATABASE_URL });

class PaymentDeclined extends Error {
  constructor(orderId, eventId) {
    super(`payment declined for order ${orderId}`);
    this.orderId = orderId;
    this.eventId = eventId;
  }
}

// Saves the order and enqueues order.placed in one transaction; resolves to { orderId, eventId }
// (strings: pg returns bigint as text, since it may exceed Number's exact range).
async function placeOrder(customer, total, { paymentOk = true } = {}) {
  // knex.transaction commits when the callback resolves and rolls back when it throws.
  return knex.transaction(async (trx) => {
    const [{ id: orderId }] = await trx('orders').insert({ customer, total }).returning('id');
    // Through trx, never knex itself: that would take another pooled connection and commit alone.
    const payload = JSON.stringify({ order_id: orderId, customer, total });
    const { rows: [{ id: eventId }] } = await trx.raw('SELECT outbox.outbox_enqueue(?, ?::jsonb) AS id', ['order.placed', payload]);
    if (!paymentOk) throw new PaymentDeclined(orderId, eventId); // the order and the event roll back
    return { orderId, eventId };
  });
}

async function main() {
  try {
    const { orderId, eventId } = await placeOrder('erin', '64.00');
    console.log(`committed order_id=${orderId} event_id=${eventId}`);
    try {
      await placeOrder('frank', '8.00', { paymentOk: false });
    } catch (error) {
      if (!(error instanceof PaymentDeclined)) throw error;
      console.log(`rolled back order_id=${error.orderId} event_id=${error.eventId}`);
    }
  } finally {
    await knex.destroy();
  }
}

main().catch((error) => {
  console.error(error);
  process.exitCode = 1;
});
