-- Record acknowledged deliveries ($1 endpoints, $2 event ids, $3 the fencing token of the claim
-- each was sent by). sent_at is written here (and, for pull endpoints, by outbox_ack_claims),
-- only where that claim is still the delivery's latest: a delivery claimed again since (its
-- lease ran out), or requeued or replayed and claimed again, belongs to the newer claim, which
-- records its own outcome. The same statement counts them, notes each endpoint's
-- success and moves ordered keys on, as a consumer's ack does (sql/pull.sql).
-- $4 is the OID of the outbox_deliveries table the deliveries were claimed from: if the outbox
-- was dropped and created again since (as an extension or by `outbox migrate`), these ids now
-- name other events, and nothing is marked.
WITH sent AS (
    UPDATE @extschema@.outbox_deliveries AS d
       SET sent_at = now(),
           dead_at = NULL,
           waiting = false
      FROM unnest($1::text[], $2::bigint[], $3::integer[]) AS a (endpoint, event_id, fence)
     WHERE d.event_id = ANY ($2)
       AND d.event_id = a.event_id
       AND d.endpoint = a.endpoint
       AND d.fence = a.fence
       AND d.sent_at IS NULL
       AND EXISTS (SELECT FROM pg_catalog.pg_class WHERE oid = $4)
    RETURNING d.endpoint, d.event_id, d.key
)
-- In endpoint order, so that two workers lock the counter and endpoint rows in the same order.
-- On an ordered endpoint, the next delivery of each key sent becomes claimable (STRICT: not
-- called for an endpoint without keys); the second column counts those, for the worker to
-- claim them.
SELECT @extschema@.outbox_note_acked(sent.endpoint, count(*)),
       @extschema@.outbox_release_keys(sent.endpoint,
                                       array_agg(sent.event_id) FILTER (WHERE sent.key IS NOT NULL),
                                       array_agg(sent.key) FILTER (WHERE sent.key IS NOT NULL))
  FROM sent
 GROUP BY sent.endpoint
 ORDER BY sent.endpoint
