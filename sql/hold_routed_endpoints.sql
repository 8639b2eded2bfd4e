-- The endpoints an event was routed to ($1), locked until the caller commits. Run by
-- outbox_enqueue only in a REPEATABLE READ or SERIALIZABLE transaction, under its caller's
-- search_path: its snapshot may predate a drop or change of an endpoint that committed since,
-- and routing by the endpoint as the snapshot shows it could leave a delivery that nothing
-- sends (a dropped endpoint, or one no longer ordered). The management functions lock an
-- endpoint's row FOR UPDATE before they change it or delete it; locking such a row changed
-- after the snapshot fails with SQLSTATE 40001 (could not serialize access), which such a
-- transaction retries. The workers' notes of an endpoint's health do not conflict.
SELECT
  FROM @extschema@.outbox_endpoints AS e
 WHERE e.name OPERATOR(pg_catalog.=) ANY ($1::pg_catalog.text[])
   FOR KEY SHARE OF e
