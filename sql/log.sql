-- Log mode (docs/log-mode.md): an enqueue writes one row into outbox_log, an append-only table
-- whose rows are never updated and whose hourly partitions are dropped whole, and the relay
-- reads the events back from a logical replication slot in commit order. A delivery the
-- receiver acknowledges writes nothing more; one that fails, or that only the table path can
-- make (a pull endpoint, an ordered key, a disabled endpoint), is copied into outbox and
-- outbox_deliveries and goes on from there as in table mode.

-- One row: whether this database is in log mode, the slot the relay reads, and how far the
-- relay has confirmed it. recover_from is the oldest transaction that may have committed after
-- the confirmed position (the xmin of a snapshot taken before it was read): were the slot lost,
-- the events of every transaction from it on are delivered again from outbox_log.
-- reader_fence and reader_until are the lease of the one relay that reads the slot.
-- recovering: the slot was made again, and what it did not hold is not yet recovered.
-- slot_made: a snapshot taken just after the slot was made. What it sees as committed is not in
-- the slot and is recovered; what it does not see is in the slot, and only there.
-- slot_ours: the slot of that name is the one outbox_log_make_slot made. Slot names are the
-- cluster's and slots have no owner: one of that name that it did not make is refused.
-- slot_wanted_from: the WAL position when the lease last found no slot. A slot made from there
-- on, and not in use, is taken for one outbox_log_make_slot made in a transaction that then
-- did not commit (the slot outlives it); that is how the first slot is made too.
-- confirmed_at: when the relay last confirmed, which it does after each read (an empty one
-- too, so that the slot keeps no WAL of other tables' writes), or when log mode was switched
-- on with nothing in the log: the slot's lag in time, which grows while no relay reads it.
-- table_since: the transaction that put the database back in table mode. A statement whose
-- snapshot is older still sees log mode and may write into the log; once no such snapshot is
-- left, logged_below is a transaction id above every one that wrote into the log. Once the
-- relay has confirmed every transaction below it (recover_from reaches it), the log is
-- delivered: the slot is dropped and the relay stops reading (outbox_log_confirm), and
-- logged_below stays as what outbox_log_maintain may drop below.
CREATE TABLE @extschema@.outbox_log_state (
    one           boolean     PRIMARY KEY DEFAULT true CHECK (one),
    enabled       boolean     NOT NULL DEFAULT false,
    slot          name        NOT NULL,
    publication   name        NOT NULL DEFAULT 'outbox_log',
    confirmed_lsn pg_lsn,
    recover_from  xid8,
    reader_fence  bigint      NOT NULL DEFAULT 0,
    reader_until  timestamptz,
    recovering    boolean     NOT NULL DEFAULT false,
    slot_made     pg_snapshot,
    slot_ours     boolean     NOT NULL DEFAULT false,
    slot_wanted_from pg_lsn,
    confirmed_at  timestamptz,
    table_since   xid8,
    logged_below  xid8
);

COMMENT ON TABLE @extschema@.outbox_log_state IS 'Log mode: whether it is on (outbox_set_mode()), the slot the relay reads, its confirmed position and the reader''s lease.';

-- A slot's name is unique in the cluster: one per database.
INSERT INTO @extschema@.outbox_log_state (slot)
SELECT 'outbox_log_' OPERATOR(pg_catalog.||) d.oid FROM pg_catalog.pg_database AS d WHERE d.datname OPERATOR(pg_catalog.=) pg_catalog.current_database();

-- The events of log mode. Column names and meanings as outbox's, so that Debezium's outbox
-- event router reads them (docs/log-mode.md#debezium): id, topic (its aggregate type and
-- type), key (its aggregate id), payload. xact is the inserting transaction, by which events
-- are found again when the slot is lost. No index: nothing reads a row by its key.
CREATE TABLE @extschema@.outbox_log (
    id         bigint      NOT NULL,
    topic      text        NOT NULL,
    payload    jsonb       NOT NULL,
    key        text,
    created_at timestamptz NOT NULL DEFAULT now(),
    xact       xid8        NOT NULL DEFAULT pg_current_xact_id()
) PARTITION BY RANGE (created_at);

COMMENT ON TABLE @extschema@.outbox_log IS 'Events enqueued in log mode, append-only, in hourly partitions the relay drops once it has read them.';

-- Rows of an hour no partition was made for yet (the relay makes them ahead): never lost.
CREATE TABLE @extschema@.outbox_log_default PARTITION OF @extschema@.outbox_log DEFAULT;

-- Makes the partitions of the next hours and drops those of hours past whose every event the
-- relay has confirmed (no row of a transaction from recover_from on, or, once the log is
-- delivered and its slot dropped, from logged_below on); empties the default partition the
-- same way. Run by the relay with its retention and by outbox_set_mode. Returns
-- how many partitions it made or dropped. A partition another session holds is left for the
-- next run (lock_timeout), so that an enqueue never waits behind this for long. One session
-- maintains at a time, and another returns at once: two making the same partition, the later
-- would find that it exists only once the first committed, and fail. Hours are UTC's, whatever
-- the caller's TimeZone: a relay or an outbox_set_mode elsewhere names and bounds them alike.
CREATE OR REPLACE FUNCTION @extschema@.outbox_log_maintain()
RETURNS integer
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET lock_timeout = '100ms'
SET TimeZone = 'UTC'
AS $$
DECLARE
    log regclass := '@extschema@.outbox_log'::regclass;
    schema text := (SELECT c.relnamespace::regnamespace::text FROM pg_class AS c WHERE c.oid = log);
    hour timestamptz := date_trunc('hour', now());
    recover xid8 := (SELECT coalesce(s.recover_from, s.logged_below) FROM @extschema@.outbox_log_state AS s);
    part record;
    changed integer := 0;
    name text;
BEGIN
    -- A lock only the owner can take (any role could hold an advisory lock, and stop this).
    BEGIN
        LOCK TABLE @extschema@.outbox_log_state IN SHARE UPDATE EXCLUSIVE MODE NOWAIT;
    EXCEPTION WHEN lock_not_available THEN
        RETURN 0;
    END;
    FOR ahead IN 0..5 LOOP
        name := 'outbox_log_' || to_char(hour + ahead * interval '1 hour', 'YYYYMMDD"h"HH24');
        CONTINUE WHEN to_regclass(format('%s.%I', schema, name)) IS NOT NULL;
        BEGIN
            EXECUTE format('CREATE TABLE %s.%I PARTITION OF %s FOR VALUES FROM (%L) TO (%L)',
                           schema, name, log, hour + ahead * interval '1 hour', hour + (ahead + 1) * interval '1 hour');
            changed := changed + 1;
        EXCEPTION WHEN lock_not_available OR check_violation OR invalid_object_definition THEN
            -- Locked now, rows of that hour already went to the default partition, or a
            -- partition of another name holds part of that hour.
            NULL;
        END;
    END LOOP;
    IF recover IS NULL THEN
        RETURN changed;
    END IF;
    FOR part IN
        SELECT c.oid::regclass AS partition, pg_get_expr(c.relpartbound, c.oid) AS bound
          FROM pg_inherits AS i
          JOIN pg_class AS c ON c.oid = i.inhrelid
         WHERE i.inhparent = log
    LOOP
        IF part.bound = 'DEFAULT' THEN
            DELETE FROM @extschema@.outbox_log_default AS l WHERE l.xact < recover;
        ELSIF substring(part.bound FROM 'TO \(''([^'']*)''\)')::timestamptz <= hour THEN
            CONTINUE WHEN EXISTS (SELECT FROM @extschema@.outbox_log AS l
                                   WHERE l.tableoid = part.partition AND l.xact >= recover);
            BEGIN
                -- Looked at again once locked: a row committed since would go with it.
                EXECUTE format('LOCK TABLE %s IN ACCESS EXCLUSIVE MODE', part.partition);
                IF NOT EXISTS (SELECT FROM @extschema@.outbox_log AS l
                                WHERE l.tableoid = part.partition AND l.xact >= recover) THEN
                    EXECUTE format('DROP TABLE %s', part.partition);
                    changed := changed + 1;
                END IF;
            EXCEPTION WHEN lock_not_available THEN
                NULL;
            END;
        END IF;
    END LOOP;
    RETURN changed;
END
$$;

REVOKE ALL ON FUNCTION @extschema@.outbox_log_maintain() FROM PUBLIC;

-- The state of the log's slot: ready; missing (dropped, or a standby promoted); lost
-- (invalidated by max_slot_wal_keep_size); or foreign: a slot of that name that
-- outbox_log_make_slot did not make (a role with REPLICATION can make one first), or not one
-- of this database's that pgoutput decodes. A foreign slot is never read, made again or
-- dropped: outbox_set_mode and outbox_log_make_slot refuse it.
CREATE OR REPLACE FUNCTION @extschema@.outbox_log_slot_state()
RETURNS text
LANGUAGE sql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT CASE WHEN r.slot_name IS NULL THEN 'missing'
                WHEN NOT s.slot_ours OR r.slot_type <> 'logical' OR r.plugin IS DISTINCT FROM 'pgoutput'
                     OR r.database IS DISTINCT FROM current_database() THEN 'foreign'
                WHEN r.wal_status = 'lost' THEN 'lost'
                ELSE 'ready' END
      FROM @extschema@.outbox_log_state AS s
      LEFT JOIN pg_replication_slots AS r ON r.slot_name = s.slot
$$;

REVOKE ALL ON FUNCTION @extschema@.outbox_log_slot_state() FROM PUBLIC;

-- Why the publication named publication is not the one the log is read through, or null when
-- it is: owned by the owner of outbox_log, publishing the inserts into outbox_log alone, whole,
-- as rows of outbox_log itself (not of its partitions). Anyone with CREATE on the database can
-- make a publication of that name first, for a table of theirs: read through it, the rows they
-- write would be sent as events, signed with the endpoints' secrets, and the real ones never.
-- Null also when no such publication exists (outbox_set_mode makes it).
CREATE OR REPLACE FUNCTION @extschema@.outbox_log_publication_problem(publication name)
RETURNS text
LANGUAGE sql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT CASE
             WHEN p.pubowner <> log.relowner
               THEN format('it is owned by %s, not by %s, the owner of %s', p.pubowner::regrole, log.relowner::regrole, log.oid::regclass)
             WHEN p.puballtables OR EXISTS (SELECT FROM pg_publication_namespace AS n WHERE n.pnpubid = p.oid)
               THEN 'it publishes tables other than ' || log.oid::regclass::text
             WHEN NOT EXISTS (SELECT FROM pg_publication_rel AS r WHERE r.prpubid = p.oid AND r.prrelid = log.oid)
               THEN 'it does not publish ' || log.oid::regclass::text
             WHEN EXISTS (SELECT FROM pg_publication_rel AS r WHERE r.prpubid = p.oid AND r.prrelid <> log.oid)
               THEN 'it publishes tables other than ' || log.oid::regclass::text
             WHEN EXISTS (SELECT FROM pg_publication_rel AS r WHERE r.prpubid = p.oid AND (r.prqual IS NOT NULL OR r.prattrs IS NOT NULL))
               THEN 'it publishes only some rows or columns of ' || log.oid::regclass::text
             WHEN NOT p.pubinsert OR NOT p.pubviaroot
               THEN 'it does not publish the inserts into ' || log.oid::regclass::text || ' as rows of that table'
           END
      FROM pg_publication AS p,
           (SELECT c.oid, c.relowner FROM pg_class AS c WHERE c.oid = '@extschema@.outbox_log'::regclass) AS log
     WHERE p.pubname = publication
$$;

REVOKE ALL ON FUNCTION @extschema@.outbox_log_publication_problem(name) FROM PUBLIC;

-- Raises when the publication the log is read through is not the outbox's own (its owner
-- dropped it and someone made another): read through it, the log's rows would be skipped and
-- confirmed as read. True otherwise, for a reader's WHERE clause.
CREATE OR REPLACE FUNCTION @extschema@.outbox_log_check_publication(publication name)
RETURNS boolean
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    problem text := @extschema@.outbox_log_publication_problem(publication);
BEGIN
    IF problem IS NOT NULL THEN
        RAISE EXCEPTION 'the publication % is not the outbox''s own: %; the log is not read through it', publication, problem
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = format('Drop it (DROP PUBLICATION %I) and run outbox_set_mode(''log'') again, which makes the outbox''s own.', publication);
    END IF;
    RETURN true;
END
$$;

REVOKE ALL ON FUNCTION @extschema@.outbox_log_check_publication(name) FROM PUBLIC;

-- Puts this database in log mode ('log') or back in table mode ('table'), for the enqueues that
-- begin after this commits; returns the mode. Log mode needs wal_level = logical, and an owner
-- that may make a replication slot; it makes the publication the slot is read through and the
-- first partitions, and marks where the relay starts: every event from here on, delivered
-- from the slot once the relay has made it, and from outbox_log before that. It refuses a
-- publication or slot of the outbox's names that the outbox did not make. Back in table mode,
-- the relay still delivers what the log holds, then drops the slot (table_since,
-- outbox_log_confirm).
CREATE OR REPLACE FUNCTION @extschema@.outbox_set_mode(mode text)
RETURNS text
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    state @extschema@.outbox_log_state;
    failure text;
    code text;
BEGIN
    IF mode IS NULL OR mode NOT IN ('table', 'log') THEN
        RAISE EXCEPTION 'outbox_set_mode: the mode is table or log, not %', coalesce(quote_literal(mode), 'null')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT * INTO state FROM @extschema@.outbox_log_state FOR UPDATE;
    IF mode = 'log' AND current_setting('wal_level') <> 'logical' THEN
        RAISE EXCEPTION 'outbox_set_mode: log mode needs wal_level = logical, and it is %', current_setting('wal_level')
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = 'Set wal_level = logical and restart the server (on Amazon RDS: rds.logical_replication = 1; on Cloud SQL: cloudsql.logical_decoding = on).';
    END IF;
    IF mode = 'log' THEN
        PERFORM @extschema@.outbox_log_check_publication(state.publication);
        CASE @extschema@.outbox_log_slot_state()
        WHEN 'foreign' THEN
            RAISE EXCEPTION 'outbox_set_mode: a replication slot named % exists that the outbox did not make', state.slot
                USING ERRCODE = 'object_not_in_prerequisite_state',
                      HINT = format('Nothing was switched. Find out who made it and why; once it is dropped (SELECT pg_drop_replication_slot(%L)), the relay makes its own.', state.slot);
        WHEN 'missing' THEN
            -- The relay makes the slot as this function's owner (outbox_log_make_slot): find out
            -- now whether it can, with a slot of its own that is gone again at once, rather than
            -- switch to a log that nothing will read.
            BEGIN
                PERFORM pg_create_physical_replication_slot('outbox_trial_' || pg_backend_pid(), false, true);
                PERFORM pg_drop_replication_slot('outbox_trial_' || pg_backend_pid());
            EXCEPTION WHEN OTHERS THEN
                GET STACKED DIAGNOSTICS failure = MESSAGE_TEXT, code = RETURNED_SQLSTATE;
                RAISE EXCEPTION 'outbox_set_mode: log mode needs a replication slot, and the outbox''s owner % cannot make one: %', current_user, failure
                    USING ERRCODE = code,
                          HINT = format('Nothing was switched. Give the owner the REPLICATION attribute (ALTER ROLE %I REPLICATION; on Amazon RDS: GRANT rds_replication TO %I), or a free slot (max_replication_slots).', current_user, current_user);
            END;
        ELSE
            NULL;
        END CASE;
        IF NOT EXISTS (SELECT FROM pg_publication AS p WHERE p.pubname = state.publication) THEN
            EXECUTE format('CREATE PUBLICATION %I FOR TABLE %s WITH (publish = ''insert'', publish_via_partition_root = true)',
                           state.publication, '@extschema@.outbox_log'::regclass);
        END IF;
        PERFORM @extschema@.outbox_log_maintain();
    END IF;
    -- recover_from is kept while the log still holds events to deliver (the slot may not even
    -- be made yet): only a log delivered, or never used, starts again from here, and counts
    -- its lag from here.
    UPDATE @extschema@.outbox_log_state AS s
       SET enabled = (mode = 'log'),
           recover_from = CASE WHEN mode = 'log' AND s.recover_from IS NULL
                               THEN pg_snapshot_xmin(pg_current_snapshot()) ELSE s.recover_from END,
           confirmed_at = CASE WHEN mode = 'log' AND s.recover_from IS NULL THEN clock_timestamp() ELSE s.confirmed_at END,
           table_since = CASE WHEN mode = 'table' AND s.enabled THEN pg_current_xact_id()
                              WHEN mode = 'table' THEN s.table_since END,
           logged_below = CASE WHEN mode = 'table' AND s.enabled THEN NULL ELSE s.logged_below END;
    RETURN mode;
END
$$;

REVOKE ALL ON FUNCTION @extschema@.outbox_set_mode(text) FROM PUBLIC;

-- The relay's lease on reading the slot: one relay reads it at a time, so no two deliver the
-- same event. fence is the lease this relay holds (0: none); the lease is renewed when it
-- still holds it, taken (with a new fence) when the holder's ran out. Returns nothing while
-- another relay holds it or before log mode was ever on; else the fence and the slot's state
-- (outbox_log_slot_state), recovering while a slot made again is ready but its events are not
-- yet recovered.
CREATE OR REPLACE FUNCTION @extschema@.outbox_log_lease(fence bigint, lease_ms double precision)
RETURNS TABLE (reader_fence bigint, slot_state text)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- Whether the caller holds the lease is read from the row the UPDATE locks (fences start
    -- at 1: 0 holds nothing). Read before it, two relays taking the lease at once could both
    -- get it: the one that waited for the other's UPDATE would renew the fence just taken.
    -- A slot found missing or lost is marked recovering here, before it is made again: made
    -- by a transaction that then does not commit, it stays, and must not pass for one whose
    -- events were recovered (with no slot_made, the recovery copies them all).
    RETURN QUERY
    WITH leased AS (
        UPDATE @extschema@.outbox_log_state AS s
           SET reader_fence = CASE WHEN s.reader_fence = fence AND fence <> 0 THEN s.reader_fence ELSE s.reader_fence + 1 END,
               reader_until = clock_timestamp() + lease_ms * interval '1 millisecond',
               recovering = s.recovering OR @extschema@.outbox_log_slot_state() <> 'ready',
               slot_made = CASE WHEN @extschema@.outbox_log_slot_state() <> 'ready' THEN NULL ELSE s.slot_made END,
               slot_wanted_from = CASE @extschema@.outbox_log_slot_state()
                                       WHEN 'missing' THEN coalesce(s.slot_wanted_from, pg_current_wal_insert_lsn())
                                       WHEN 'ready' THEN NULL
                                       ELSE s.slot_wanted_from END
         WHERE (s.enabled OR s.recover_from IS NOT NULL)
           AND ((s.reader_fence = fence AND fence <> 0) OR s.reader_until IS NULL OR s.reader_until < clock_timestamp())
        RETURNING s.reader_fence, s.slot, s.recovering)
    SELECT l.reader_fence, CASE WHEN t.state = 'ready' AND l.recovering THEN 'recovering' ELSE t.state END
      FROM leased AS l
     CROSS JOIN LATERAL (SELECT @extschema@.outbox_log_slot_state() AS state) AS t;
END
$$;

REVOKE ALL ON FUNCTION @extschema@.outbox_log_lease(bigint, double precision) FROM PUBLIC;

-- Copies events read from the log into the table path: one delivery per (event, endpoint),
-- with its attempts so far, the error of the last, and when it is due. Each array has one
-- element per delivery; the event columns repeat for each of its endpoints. A copy already
-- made (the same event and endpoint) is left as it is, so a batch read twice copies once.
CREATE OR REPLACE FUNCTION @extschema@.outbox_log_defer(
    ids bigint[], topics text[], payloads text[], keys text[], created text[],
    endpoints text[], attempts integer[], errors text[], due_in_ms double precision[])
RETURNS bigint
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    made bigint;
BEGIN
    INSERT INTO @extschema@.outbox AS o (id, topic, payload, key, created_at)
    OVERRIDING SYSTEM VALUE
    SELECT DISTINCT ON (t.id) t.id, t.topic, t.payload::jsonb, t.key, t.created::timestamptz
      FROM unnest(ids, topics, payloads, keys, created) AS t (id, topic, payload, key, created)
    ON CONFLICT (id) DO NOTHING;
    WITH copied AS (
        INSERT INTO @extschema@.outbox_deliveries AS d (event_id, endpoint, available_at, attempts, fence, last_error, key, waiting)
        SELECT t.id, t.endpoint, now() + t.due_in_ms * interval '1 millisecond', t.attempts, t.attempts, t.error,
               CASE WHEN e.ordered THEN t.key END, e.ordered AND t.key IS NOT NULL
          FROM unnest(ids, keys, endpoints, attempts, errors, due_in_ms) AS t (id, key, endpoint, attempts, error, due_in_ms)
          JOIN @extschema@.outbox_endpoints AS e ON e.name = t.endpoint
        ON CONFLICT (event_id, endpoint) DO NOTHING
        RETURNING d.endpoint, d.key, d.waiting),
    -- The sequencer gives each ordered key its head, as after an enqueue (note_key_arrivals.sql).
    arrivals AS (
        INSERT INTO @extschema@.outbox_key_arrivals (endpoint, key)
        SELECT c.endpoint, c.key FROM copied AS c WHERE c.waiting)
    SELECT count(*) INTO made FROM copied AS c;
    RETURN made;
END
$$;

REVOKE ALL ON FUNCTION @extschema@.outbox_log_defer(bigint[], text[], text[], text[], text[], text[], integer[], text[], double precision[]) FROM PUBLIC;

-- After the slot was lost (dropped, invalidated, or not on a promoted standby) and made again:
-- every event of a transaction from recover_from on that committed before the new slot was
-- made goes to the table path, due now, for each endpoint it is routed to. Some were delivered
-- already, and are delivered again (consumers deduplicate by id); none is missed. Those
-- committed later are the new slot's alone. Returns how many deliveries it made. Copied at
-- most 10,000 deliveries or 64 MB of payloads at a time (each counts as at least 6,711 bytes):
-- one array of every payload held since the slot was lost could pass the 1 GB a value may
-- take. created_at goes through text, in ISO style whatever the session's (another style may
-- write a zone's abbreviation, which reads back ambiguously).
CREATE OR REPLACE FUNCTION @extschema@.outbox_log_recover(fence bigint)
RETURNS bigint
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET datestyle = 'ISO'
AS $$
DECLARE
    recover xid8;
    made_at pg_snapshot;
    made bigint;
BEGIN
    SELECT s.recover_from, s.slot_made INTO recover, made_at
      FROM @extschema@.outbox_log_state AS s WHERE s.reader_fence = fence FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'outbox_log_recover: another relay reads the log now' USING ERRCODE = 'lock_not_available';
    END IF;
    SELECT sum(@extschema@.outbox_log_defer(c.ids, c.topics, c.payloads, c.keys, c.created, c.endpoints,
                                            c.attempts, c.errors, c.due_in_ms))
      INTO made
      FROM (SELECT array_agg(e.id) AS ids, array_agg(e.topic) AS topics, array_agg(e.payload) AS payloads,
                   array_agg(e.key) AS keys, array_agg(e.created) AS created, array_agg(e.endpoint) AS endpoints,
                   array_agg(0) AS attempts, array_agg(NULL::text) AS errors, array_agg(0::double precision) AS due_in_ms
              FROM (SELECT l.id, l.topic, l.payload::text AS payload, l.key, l.created_at::text AS created,
                           r.name AS endpoint,
                           sum(greatest(octet_length(l.payload::text), 6711)) OVER (ROWS UNBOUNDED PRECEDING) / 67108864 AS chunk
                      FROM @extschema@.outbox_log AS l
                      JOIN @extschema@.outbox_endpoints AS r ON r.topics OPERATOR(pg_catalog.&&) @extschema@.outbox_topic_patterns(l.topic)
                     WHERE l.xact >= coalesce(recover, '0'::xid8)
                       AND (made_at IS NULL OR pg_visible_in_snapshot(l.xact, made_at))) AS e
             GROUP BY e.chunk) AS c;
    -- From here on, the new slot holds whatever is not delivered: every transaction that
    -- committed after it was made is at least the oldest running then, and is recovered from
    -- there if this slot is lost too.
    UPDATE @extschema@.outbox_log_state
       SET confirmed_lsn = NULL, recover_from = coalesce(pg_snapshot_xmin(made_at), pg_snapshot_xmin(pg_current_snapshot())),
           recovering = false, slot_made = NULL;
    RETURN coalesce(made, 0);
END
$$;

REVOKE ALL ON FUNCTION @extschema@.outbox_log_recover(bigint) FROM PUBLIC;

-- The relay confirms that every delivery of the events up to reached (a WAL position as a
-- number) is acknowledged or copied into the table path: the slot may let go of them, and a
-- lost slot is recovered from the transactions from oldest on (the oldest running when a read
-- began whose position was at most reached). Only the relay that holds the lease (fence)
-- confirms, and not while a slot made again is not yet recovered; false otherwise.
-- Back in table mode, once the log is delivered (table_since, logged_below), the slot is
-- dropped instead of advanced and the lease let go: the relay stops reading, and the slot
-- keeps no WAL of the table path's writes. advance_slot is false for a relay that streams the
-- slot (outbox relay): it confirms the position on its replication connection, and the slot,
-- which its stream holds, can be neither advanced nor dropped here; it reads with
-- outbox_log_read once log mode is off, and its confirmation then drops the slot.
CREATE OR REPLACE FUNCTION @extschema@.outbox_log_confirm(fence bigint, reached bigint, oldest bigint, advance_slot boolean DEFAULT true)
RETURNS boolean
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    state @extschema@.outbox_log_state;
    switched xid8;
    below xid8;
    position pg_lsn := '0/0'::pg_lsn + reached::numeric;
BEGIN
    SELECT s.table_since INTO switched FROM @extschema@.outbox_log_state AS s WHERE NOT s.enabled;
    -- No snapshot older than the switch is left in this database: no statement can write into
    -- the log any more, and each one that did took its transaction id before the one this
    -- transaction takes now (after the look, and its first: it has written nothing yet).
    IF switched IS NOT NULL AND pg_current_xact_id_if_assigned() IS NULL
       AND NOT EXISTS (SELECT FROM pg_stat_activity AS a
                        WHERE a.datname = current_database() AND a.pid <> pg_backend_pid()
                          AND age(a.backend_xmin) >= age(xid(switched))) THEN
        below := pg_current_xact_id();
    END IF;
    UPDATE @extschema@.outbox_log_state AS s
       SET confirmed_lsn = position, recover_from = greatest(s.recover_from, oldest::text::xid8), confirmed_at = clock_timestamp(),
           table_since = CASE WHEN s.table_since = switched AND below IS NOT NULL THEN NULL ELSE s.table_since END,
           logged_below = CASE WHEN s.table_since = switched AND below IS NOT NULL THEN below ELSE s.logged_below END
     WHERE s.reader_fence = outbox_log_confirm.fence AND NOT s.recovering
    RETURNING s.* INTO state;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    IF NOT advance_slot THEN
        RETURN true;
    END IF;
    IF state.enabled OR state.logged_below IS NULL OR state.recover_from < state.logged_below THEN
        PERFORM pg_replication_slot_advance(state.slot, position);
        RETURN true;
    END IF;
    -- Every transaction that wrote into the log is confirmed.
    IF state.slot_ours AND EXISTS (SELECT FROM pg_replication_slots AS r WHERE r.slot_name = state.slot) THEN
        PERFORM pg_drop_replication_slot(state.slot);
    END IF;
    UPDATE @extschema@.outbox_log_state
       SET recover_from = NULL, confirmed_lsn = NULL, confirmed_at = NULL, reader_until = NULL, slot_ours = false;
    RETURN true;
END
$$;

REVOKE ALL ON FUNCTION @extschema@.outbox_log_confirm(bigint, bigint, bigint, boolean) FROM PUBLIC;

-- Up to about max_changes changes from the slot, from its confirmed position on, without
-- consuming them (outbox_log_confirm does, once they are delivered): pgoutput messages (begin,
-- relation, insert, commit) of whole transactions, each with its position. The last row has
-- no message: its xmin and began_at are the oldest transaction running when this read began
-- and the WAL position written then (as numbers), which outbox_log_confirm takes as oldest for
-- a position at or past it; flushed_at is the WAL position flushed then, which the read
-- decodes at least up to, and where a read that found nothing confirms (an asynchronous
-- commit written before began_at may not be flushed yet). endpoints_version is the endpoints'
-- version once the changes are read (an endpoint subscribed before an event read committed is
-- in it): the relay reads the endpoints again first if it differs, as before a claim. Timestamps come in ISO style, which the relay's bodies are built from
-- (core/src/log/routes.rs). Only the relay that holds the lease,
-- and has not let it run out, reads; any other gets no rows, and so does every relay while a
-- slot made again is not yet recovered (its first confirmation would move recover_from past
-- the events that only outbox_log_recover copies).
CREATE OR REPLACE FUNCTION @extschema@.outbox_log_read(fence bigint, max_changes integer)
RETURNS TABLE (lsn bigint, data bytea, xmin bigint, began_at bigint, flushed_at bigint, endpoints_version bigint,
               log_relation bigint)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET datestyle = 'ISO'
AS $$
DECLARE
    state @extschema@.outbox_log_state;
    oldest bigint := pg_snapshot_xmin(pg_current_snapshot())::text::bigint;
    position bigint := (pg_current_wal_insert_lsn() - '0/0'::pg_lsn)::bigint;
    flushed bigint := (pg_current_wal_flush_lsn() - '0/0'::pg_lsn)::bigint;
BEGIN
    SELECT * INTO state FROM @extschema@.outbox_log_state AS s
     WHERE s.reader_fence = fence AND s.reader_until > clock_timestamp() AND NOT s.recovering;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    PERFORM @extschema@.outbox_log_check_publication(state.publication);
    -- A stream that ended (outbox_log_read_start) may not have told the slot the position
    -- confirmed last: what was delivered up to it is not read again.
    IF state.confirmed_lsn > (SELECT r.confirmed_flush_lsn FROM pg_replication_slots AS r WHERE r.slot_name = state.slot) THEN
        PERFORM pg_replication_slot_advance(state.slot, state.confirmed_lsn);
    END IF;
    RETURN QUERY
    SELECT (c.lsn - '0/0'::pg_lsn)::bigint, c.data, NULL::bigint, NULL::bigint, NULL::bigint, NULL::bigint, NULL::bigint
      FROM pg_logical_slot_peek_binary_changes(state.slot, NULL, max_changes,
                                               'proto_version', '1', 'publication_names', state.publication) AS c;
    RETURN QUERY SELECT NULL::bigint, NULL::bytea, oldest, position, flushed,
                        coalesce((SELECT v.version FROM @extschema@.outbox_endpoints_version AS v), 0),
                        '@extschema@.outbox_log'::regclass::oid::bigint;
END
$$;

REVOKE ALL ON FUNCTION @extschema@.outbox_log_read(bigint, integer) FROM PUBLIC;

-- For a relay that streams the slot instead of reading it here (outbox relay), at each read of
-- the stream: the oldest transaction running and the WAL position written, as
-- outbox_log_read's first row has them; the slot and publication to stream, from the position
-- confirmed last (as a number; the slot's own may lag, its stream having ended before it sent
-- it); and whether log mode is on (off, the relay reads with outbox_log_read, whose
-- confirmation can drop the slot); the endpoints' version, as outbox_log_read gives it (the
-- relay takes what its stream received before it asks); and the
-- session's time zone, in which the stream writes timestamps as a read here does. No rows for
-- a relay that does not hold the lease, or while a slot made again is not yet recovered.
CREATE OR REPLACE FUNCTION @extschema@.outbox_log_read_start(fence bigint)
RETURNS TABLE (enabled boolean, slot name, publication name, confirmed bigint, xmin bigint, began_at bigint,
               endpoints_version bigint, timezone text, log_relation bigint)
LANGUAGE sql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT s.enabled, s.slot, s.publication, (s.confirmed_lsn - '0/0'::pg_lsn)::bigint,
           pg_snapshot_xmin(pg_current_snapshot())::text::bigint, (pg_current_wal_insert_lsn() - '0/0'::pg_lsn)::bigint,
           coalesce((SELECT v.version FROM @extschema@.outbox_endpoints_version AS v), 0), current_setting('TimeZone'),
           '@extschema@.outbox_log'::regclass::oid::bigint
      FROM @extschema@.outbox_log_state AS s
     WHERE s.reader_fence = fence AND s.reader_until > clock_timestamp() AND NOT s.recovering
       AND @extschema@.outbox_log_check_publication(s.publication)
$$;

REVOKE ALL ON FUNCTION @extschema@.outbox_log_read_start(bigint) FROM PUBLIC;

-- Where events of the topics just read go: one row per (topic, endpoint). sendable: the relay
-- may send to it now (an enabled webhook endpoint); ordered: it keeps each key's order. The
-- relay sends an event now to a sendable endpoint unless the event has a key and the endpoint
-- is ordered; it copies the rest into the table path, where pull consumers claim them, an
-- ordered key keeps its order and a disabled endpoint keeps them. It keeps these rows until
-- the endpoints change (core/src/log/routes.rs), and builds each body itself.
-- PL/pgSQL, so that it may name outbox_topic_patterns, which sql/api.sql makes later.
CREATE OR REPLACE FUNCTION @extschema@.outbox_log_route(topics text[])
RETURNS TABLE (topic text, endpoint text, sendable boolean, ordered boolean)
LANGUAGE plpgsql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN QUERY
    SELECT t.topic, e.name, e.kind = 'webhook' AND e.disabled_at IS NULL, e.ordered
      FROM (SELECT DISTINCT u.topic FROM unnest(topics) AS u (topic)) AS t
      JOIN @extschema@.outbox_endpoints AS e ON e.topics && @extschema@.outbox_topic_patterns(t.topic);
END
$$;

REVOKE ALL ON FUNCTION @extschema@.outbox_log_route(text[]) FROM PUBLIC;

-- How far the relay is behind in log mode, for monitoring: the WAL the slot keeps past its
-- confirmed position (bytes) and how long ago the relay last confirmed (seconds); a relay
-- that keeps up confirms after every read. No row in table mode, before log mode was ever on.
CREATE OR REPLACE FUNCTION @extschema@.outbox_log_lag()
RETURNS TABLE (slot name, slot_state text, lag_bytes bigint, lag_seconds double precision)
LANGUAGE sql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT s.slot,
           @extschema@.outbox_log_slot_state(),
           coalesce((pg_current_wal_lsn() - r.confirmed_flush_lsn)::bigint, 0),
           coalesce(extract(epoch FROM now() - s.confirmed_at)::double precision, 0)
      FROM @extschema@.outbox_log_state AS s
      LEFT JOIN pg_replication_slots AS r ON r.slot_name = s.slot
     WHERE s.enabled OR s.recover_from IS NOT NULL
$$;

REVOKE ALL ON FUNCTION @extschema@.outbox_log_lag() FROM PUBLIC;

-- The events the log holds that no relay has read yet, per endpoint their topic is routed to,
-- and the oldest of them: what outbox_endpoint_stats counts as pending beside the table path's
-- deliveries, so that a log nobody reads shows. Counted only while the reading stalls (no
-- confirmation for 10 seconds, or no slot of the outbox's to read): a relay that keeps up
-- confirms after every read, at least at each poll, and a count would read every row of the
-- log from recover_from on. Events of transactions from recover_from on that were confirmed
-- before the stall are counted too: at most a read's worth. A stalled log grows, and a
-- monitor reads this every few seconds: at most 100,000 of its rows are read, so a count
-- that reaches it means at least that many.
CREATE OR REPLACE FUNCTION @extschema@.outbox_log_unread()
RETURNS TABLE (endpoint text, unread bigint, oldest timestamptz)
LANGUAGE plpgsql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    state @extschema@.outbox_log_state;
BEGIN
    SELECT * INTO state FROM @extschema@.outbox_log_state AS s WHERE s.recover_from IS NOT NULL;
    IF NOT FOUND OR (state.confirmed_at > clock_timestamp() - interval '10 seconds'
                     AND @extschema@.outbox_log_slot_state() = 'ready') THEN
        RETURN;
    END IF;
    RETURN QUERY
    SELECT e.name, count(*), min(l.created_at)
      FROM (SELECT u.topic, u.created_at FROM @extschema@.outbox_log AS u
             WHERE u.xact >= state.recover_from LIMIT 100000) AS l
      JOIN @extschema@.outbox_endpoints AS e ON e.topics && @extschema@.outbox_topic_patterns(l.topic)
     GROUP BY e.name;
END
$$;

REVOKE ALL ON FUNCTION @extschema@.outbox_log_unread() FROM PUBLIC;
