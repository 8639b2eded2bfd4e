-- Pull endpoints with notify set ($1) that an event was routed to: a NOTIFY on channel
-- "outbox.<name>", sent when the enqueuing transaction commits. Run by outbox_enqueue only
-- then, under its caller's search_path.
SELECT pg_catalog.pg_notify('outbox.' OPERATOR(pg_catalog.||) endpoint, '')
  FROM pg_catalog.unnest($1::pg_catalog.text[]) AS endpoint
