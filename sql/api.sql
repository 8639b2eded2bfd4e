-- The SQL-only part of the user-facing API. outbox_enqueue() is in src/api.rs, because it
-- checks a setting and wakes the workers at commit.
--
-- Privileges: every function below runs as the extension's owner (SECURITY DEFINER) with
-- search_path pinned to pg_catalog, so a role needs nothing but EXECUTE on a function to use
-- it, can do nothing through it but what it says, and nothing that role (or anyone) created
-- can run inside it. EXECUTE is granted to nobody by default: see the README's GRANT recipes.

-- For consumers: call in the transaction that applies the event. True the first time this
-- consumer sees the id; false for a duplicate, whose effect the caller then skips.
CREATE FUNCTION outbox_mark_processed(event_id bigint, consumer text DEFAULT 'default')
RETURNS boolean
LANGUAGE sql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    WITH recorded AS (
        INSERT INTO @extschema@.processed_events (consumer, event_id)
        VALUES ($2, $1)
        ON CONFLICT DO NOTHING
        RETURNING 1
    )
    SELECT count(*) = 1 FROM recorded
$$;

-- Puts a dead (or pending) event back in the queue with a fresh attempt budget.
-- False when the event was already sent or does not exist.
CREATE FUNCTION outbox_requeue(id bigint)
RETURNS boolean
LANGUAGE sql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    WITH requeued AS (
        UPDATE @extschema@.outbox
           SET dead_at = NULL, attempts = 0, available_at = now()
         WHERE outbox.id = $1
           AND sent_at IS NULL
        RETURNING 1
    )
    SELECT count(*) = 1 FROM requeued
$$;

-- The numbers an alert watches. pending: due now; waiting: claimed or backing off;
-- oldest_pending_age: age of the oldest event not yet sent nor dead.
CREATE FUNCTION outbox_stats(
    OUT pending bigint,
    OUT waiting bigint,
    OUT sent bigint,
    OUT dead bigint,
    OUT oldest_pending_age interval)
LANGUAGE sql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT count(*) FILTER (WHERE sent_at IS NULL AND dead_at IS NULL AND available_at <= now()),
           count(*) FILTER (WHERE sent_at IS NULL AND dead_at IS NULL AND available_at > now()),
           count(*) FILTER (WHERE sent_at IS NOT NULL),
           count(*) FILTER (WHERE dead_at IS NOT NULL),
           now() - min(created_at) FILTER (WHERE sent_at IS NULL AND dead_at IS NULL)
      FROM @extschema@.outbox
$$;

-- PostgreSQL lets PUBLIC execute every new function; take that back, for the functions above
-- and for the two written in Rust.
REVOKE ALL ON FUNCTION outbox_enqueue(text, jsonb) FROM PUBLIC;
REVOKE ALL ON FUNCTION outbox_mark_processed(bigint, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION outbox_requeue(bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION outbox_stats() FROM PUBLIC;
REVOKE ALL ON FUNCTION outbox_workers() FROM PUBLIC;
