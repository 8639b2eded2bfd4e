-- The SQL-only part of the user-facing API. outbox_enqueue() is in src/api.rs, because it
-- checks a setting and wakes the workers at commit.

-- For consumers: call in the transaction that applies the event. True the first time this
-- consumer sees the id; false for a duplicate, whose effect the caller then skips.
CREATE FUNCTION outbox_mark_processed(event_id bigint, consumer text DEFAULT 'default')
RETURNS boolean
LANGUAGE sql
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
AS $$
    SELECT count(*) FILTER (WHERE sent_at IS NULL AND dead_at IS NULL AND available_at <= now()),
           count(*) FILTER (WHERE sent_at IS NULL AND dead_at IS NULL AND available_at > now()),
           count(*) FILTER (WHERE sent_at IS NOT NULL),
           count(*) FILTER (WHERE dead_at IS NOT NULL),
           now() - min(created_at) FILTER (WHERE sent_at IS NULL AND dead_at IS NULL)
      FROM @extschema@.outbox
$$;
