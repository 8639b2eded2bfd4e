-- Attempts a stopping relay abandons ($1 endpoints, $2 event ids, $3 the fencing token of each
-- one's claim, $5 who claimed them, as in claim_batch.sql): they do not count against the cap
-- (the fence stays: it never goes back). Each delivery keeps its lease, so nobody sends it while the
-- abandoned request may still reach its receiver; once the lease runs out it is attempted
-- again, even if this was its last allowed attempt (sql/claim_batch.sql would otherwise make
-- it dead: a restart is no reason to give up on a delivery). Only this relay's current
-- claims of deliveries still undecided are touched. $4 is the outbox_deliveries table the
-- deliveries were claimed from, as in mark_sent.sql.
UPDATE @extschema@.outbox_deliveries AS d
   SET attempts = d.attempts - 1
  FROM unnest($1::text[], $2::bigint[], $3::integer[]) AS a (endpoint, event_id, fence)
 WHERE d.event_id = ANY ($2)
   AND d.event_id = a.event_id
   AND d.endpoint = a.endpoint
   AND d.fence = a.fence
   AND d.claimed_by = $5
   AND d.sent_at IS NULL
   AND d.dead_at IS NULL
   AND EXISTS (SELECT FROM pg_catalog.pg_class WHERE oid = $4)
