-- The endpoints an event was routed to ($1), locked against being dropped until the caller
-- commits. Run by outbox_enqueue only in a REPEATABLE READ or SERIALIZABLE transaction, under
-- its caller's search_path: its snapshot may predate an outbox_endpoint_drop that committed
-- since, and a delivery to an endpoint that is gone would never be sent. Locking a row deleted
-- after the snapshot fails with SQLSTATE 40001 (could not serialize access), which such a
-- transaction retries; changes that keep the endpoint's name do not conflict with this lock.
SELECT
  FROM @extschema@.outbox_endpoints AS e
 WHERE e.name OPERATOR(pg_catalog.=) ANY ($1::pg_catalog.text[])
   FOR KEY SHARE OF e
