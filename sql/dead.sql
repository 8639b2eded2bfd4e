-- Dead deliveries found, requeued and skipped by a filter, as an operator paged at night needs
-- them (docs/runbook.md): which endpoint, which topic (exact, or a pattern as endpoints
-- subscribe with: 'order.*', '*'), which error (a part of last_error, in any case) and when
-- they died (dead_at in [since, until)). A null filters nothing.
--
-- On an ordered endpoint a dead delivery blocks its key while it is the key's head
-- (outbox_keys). One that is not the head any more was skipped (outbox_skip): the key went on
-- without it, so a bulk requeue leaves it dead rather than send it after the events that
-- followed it (outbox_requeue brings one back on purpose).

-- The dead deliveries a filter matches: the one place the three functions below read it from.
-- It checks the filter, so a typing mistake is an error, not a silent match of nothing.
CREATE OR REPLACE FUNCTION @extschema@.outbox_dead_matching(
    endpoint text, topic text, error text, since timestamptz, until timestamptz)
RETURNS SETOF @extschema@.outbox_deliveries
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF $2 IS NOT NULL AND $2 !~ '^(\*|[^.*]+(\.[^.*]+)*(\.\*)?)$' THEN
        RAISE EXCEPTION 'outbox: % is not a topic pattern', quote_literal($2)
              USING ERRCODE = 'invalid_parameter_value',
                    HINT = 'Write a topic (order.placed), a prefix (order.*) or *.';
    END IF;
    IF $1 IS NOT NULL AND NOT EXISTS (SELECT FROM @extschema@.outbox_endpoints AS e WHERE e.name = $1) THEN
        RAISE EXCEPTION 'outbox: endpoint % does not exist', quote_literal($1)
              USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF $4 >= $5 THEN
        RAISE EXCEPTION 'outbox: since (%) must be before until (%)', $4, $5
              USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN QUERY
        SELECT d.*
          FROM @extschema@.outbox_deliveries AS d
          JOIN @extschema@.outbox AS o ON o.id = d.event_id
         WHERE d.dead_at IS NOT NULL
           AND ($1 IS NULL OR d.endpoint = $1)
           AND ($2 IS NULL OR $2 = ANY (@extschema@.outbox_topic_patterns(o.topic)))
           AND ($3 IS NULL OR strpos(lower(d.last_error), lower($3)) > 0)
           AND ($4 IS NULL OR d.dead_at >= $4)
           AND ($5 IS NULL OR d.dead_at < $5);
END
$$;

-- The dead deliveries a filter matches, the most recently dead first, at most max_rows: what
-- failed, and what the receiver last answered (from outbox_attempts).
CREATE TYPE @extschema@.outbox_dead_delivery AS (
    endpoint text,
    event_id bigint,
    topic text,
    key text,
    attempts integer,
    dead_at timestamptz,
    last_error text,
    last_status integer,
    last_response text,
    skipped boolean
);

CREATE OR REPLACE FUNCTION @extschema@.outbox_dead(
    endpoint text DEFAULT NULL,
    topic text DEFAULT NULL,
    error text DEFAULT NULL,
    since timestamptz DEFAULT NULL,
    until timestamptz DEFAULT NULL,
    max_rows integer DEFAULT 100)
RETURNS SETOF @extschema@.outbox_dead_delivery
LANGUAGE plpgsql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF max_rows IS NULL OR max_rows < 1 THEN
        RAISE EXCEPTION 'outbox_dead: max_rows must be 1 or more, not %', coalesce(max_rows::text, 'null')
              USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN QUERY
        SELECT d.endpoint, d.event_id, o.topic, o.key, d.attempts, d.dead_at, d.last_error, a.status, a.response,
               d.key IS NOT NULL AND k.head IS NULL
          -- The newest max_rows first, then their events and answers: not one lookup per match.
          FROM (SELECT * FROM @extschema@.outbox_dead_matching($1, $2, $3, $4, $5) AS m
                 ORDER BY m.dead_at DESC, m.event_id DESC
                 LIMIT max_rows) AS d
          JOIN @extschema@.outbox AS o ON o.id = d.event_id
          LEFT JOIN @extschema@.outbox_keys AS k ON k.endpoint = d.endpoint AND k.key = d.key AND k.head = d.event_id
          LEFT JOIN LATERAL (SELECT f.status, f.response
                               FROM @extschema@.outbox_attempts AS f
                              WHERE f.event_id = d.event_id AND f.endpoint = d.endpoint
                              ORDER BY f.failed_at DESC
                              LIMIT 1) AS a ON true
         ORDER BY d.dead_at DESC, d.event_id DESC;
END
$$;

-- Puts every dead delivery a filter matches back in the queue, oldest event first, each as
-- outbox_requeue does it, but for skipped ones. With dry_run (the default) it changes nothing
-- and returns how many it would requeue: count first, then run again with dry_run => false.
CREATE OR REPLACE FUNCTION @extschema@.outbox_requeue_dead(
    endpoint text DEFAULT NULL,
    topic text DEFAULT NULL,
    error text DEFAULT NULL,
    since timestamptz DEFAULT NULL,
    until timestamptz DEFAULT NULL,
    dry_run boolean DEFAULT true)
RETURNS bigint
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    how_many bigint;
BEGIN
    IF dry_run IS NOT false THEN
        SELECT count(*) INTO how_many
          FROM @extschema@.outbox_dead_matching($1, $2, $3, $4, $5) AS m
          LEFT JOIN @extschema@.outbox_keys AS k ON k.endpoint = m.endpoint AND k.key = m.key AND k.head = m.event_id
         WHERE m.key IS NULL OR k.head IS NOT NULL;
    ELSE
        SELECT coalesce(sum(@extschema@.outbox_requeue(m.event_id, m.endpoint)), 0) INTO how_many
          FROM (SELECT m.event_id, m.endpoint
                  FROM @extschema@.outbox_dead_matching($1, $2, $3, $4, $5) AS m
                  LEFT JOIN @extschema@.outbox_keys AS k ON k.endpoint = m.endpoint AND k.key = m.key AND k.head = m.event_id
                 WHERE m.key IS NULL OR k.head IS NOT NULL
                 ORDER BY m.event_id) AS m;
    END IF;
    RETURN how_many;
END
$$;

-- Skips, as outbox_skip does, every dead delivery a filter matches that blocks its key (the
-- head of its key on an ordered endpoint), oldest event first. With dry_run (the default) it
-- changes nothing and returns how many it would skip. The next delivery of a key is never dead,
-- so a run skips what its dry run counted, unless deliveries die, are requeued or expire between
-- the two (pass the dry run's until to keep new deaths out).
CREATE OR REPLACE FUNCTION @extschema@.outbox_skip_dead(
    endpoint text DEFAULT NULL,
    topic text DEFAULT NULL,
    error text DEFAULT NULL,
    since timestamptz DEFAULT NULL,
    until timestamptz DEFAULT NULL,
    dry_run boolean DEFAULT true)
RETURNS bigint
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    how_many bigint;
BEGIN
    IF dry_run IS NOT false THEN
        SELECT count(*) INTO how_many
          FROM @extschema@.outbox_dead_matching($1, $2, $3, $4, $5) AS m
          JOIN @extschema@.outbox_keys AS k ON k.endpoint = m.endpoint AND k.key = m.key AND k.head = m.event_id;
    ELSE
        SELECT count(*) FILTER (WHERE @extschema@.outbox_skip(m.endpoint, m.event_id)) INTO how_many
          FROM (SELECT m.event_id, m.endpoint
                  FROM @extschema@.outbox_dead_matching($1, $2, $3, $4, $5) AS m
                  JOIN @extschema@.outbox_keys AS k ON k.endpoint = m.endpoint AND k.key = m.key AND k.head = m.event_id
                 ORDER BY m.event_id) AS m;
    END IF;
    RETURN how_many;
END
$$;

REVOKE ALL ON FUNCTION @extschema@.outbox_dead_matching(text, text, text, timestamptz, timestamptz) FROM PUBLIC;
REVOKE ALL ON FUNCTION @extschema@.outbox_dead(text, text, text, timestamptz, timestamptz, integer) FROM PUBLIC;
REVOKE ALL ON FUNCTION @extschema@.outbox_requeue_dead(text, text, text, timestamptz, timestamptz, boolean) FROM PUBLIC;
REVOKE ALL ON FUNCTION @extschema@.outbox_skip_dead(text, text, text, timestamptz, timestamptz, boolean) FROM PUBLIC;
