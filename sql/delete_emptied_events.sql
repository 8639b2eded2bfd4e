-- Retention, second statement: of the events sql/delete_expired.sql locked ($1), deletes those
-- left with no delivery and no unrouted row. A statement of its own, so that its snapshot,
-- taken after those locks, shows every delivery written for them: outbox_replay locks an
-- event before it writes one, and waits for these locks.
DELETE FROM @extschema@.outbox AS o
 WHERE o.id = ANY ($1::bigint[])
   AND NOT EXISTS (SELECT FROM @extschema@.outbox_deliveries AS d WHERE d.event_id = o.id)
   AND NOT EXISTS (SELECT FROM @extschema@.outbox_unrouted AS u WHERE u.event_id = o.id)
