-- Making the log's slot (sql/log.sql has the rest of log mode), where PostgreSQL's majors
-- differ: from 17 on, a logical slot can follow a failover to a standby.

-- Whether this server makes the log's slot a failover slot: from PostgreSQL 17 on.
CREATE OR REPLACE FUNCTION @extschema@.outbox_log_slots_fail_over()
RETURNS boolean
LANGUAGE sql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT current_setting('server_version_num')::integer >= 170000
$$;

REVOKE ALL ON FUNCTION @extschema@.outbox_log_slots_fail_over() FROM PUBLIC;

-- Makes the slot again when it is missing, or lost (dropped first): run first in its
-- transaction, since a slot cannot be made in one that wrote, and at READ COMMITTED. Returns
-- whether it made one; the relay then runs outbox_log_recover (recovering says so until it
-- has).
CREATE OR REPLACE FUNCTION @extschema@.outbox_log_make_slot(fence bigint)
RETURNS boolean
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    state @extschema@.outbox_log_state;
    status text;
BEGIN
    -- At REPEATABLE READ the snapshot taken below would be the transaction's first, older
    -- than the slot: what committed in between would be neither in the slot nor recovered.
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'outbox_log_make_slot: run it at READ COMMITTED, not %', current_setting('transaction_isolation')
            USING ERRCODE = 'invalid_transaction_state';
    END IF;
    SELECT * INTO state FROM @extschema@.outbox_log_state AS s WHERE s.reader_fence = fence;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    status := @extschema@.outbox_log_slot_state();
    IF status = 'foreign' AND EXISTS (
        SELECT FROM pg_replication_slots AS r
         WHERE r.slot_name = state.slot AND r.slot_type = 'logical' AND r.plugin = 'pgoutput'
           AND r.database = current_database() AND NOT r.temporary AND NOT r.two_phase AND r.active_pid IS NULL
           AND r.restart_lsn >= state.slot_wanted_from
           -- pg_replication_slots has a failover column from 17 on: read by name, as JSON.
           AND (NOT @extschema@.outbox_log_slots_fail_over() OR (to_jsonb(r) ->> 'failover')::boolean)) THEN
        -- Made after the lease found none: by this function, in a transaction that did not
        -- commit. (A role with REPLICATION could have made it in that window, as it could drop
        -- and make any slot at any time: docs/security.md.)
        UPDATE @extschema@.outbox_log_state
           SET recovering = true, slot_made = pg_current_snapshot(), slot_ours = true, slot_wanted_from = NULL;
        RETURN true;
    ELSIF status = 'foreign' THEN
        RAISE EXCEPTION 'outbox_log_make_slot: a replication slot named % exists that the outbox did not make: the log is not read until it is dropped', state.slot
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = format('Find out who made it and why; once it is dropped (SELECT pg_drop_replication_slot(%L)), the relay makes its own.', state.slot);
    ELSIF status = 'ready' THEN
        RETURN false;
    ELSIF status = 'lost' THEN
        PERFORM pg_drop_replication_slot(state.slot);
    END IF;
    -- From 17 on, a failover slot: a standby that synchronises slots keeps a copy, which its
    -- relay reads on from once promoted (docs/log-mode.md, "Failovers"). Before, no slot
    -- reaches a standby, and the promoted server's relay makes one and recovers.
    IF @extschema@.outbox_log_slots_fail_over() THEN
        PERFORM pg_create_logical_replication_slot(state.slot, 'pgoutput', failover => true);
    ELSE
        PERFORM pg_create_logical_replication_slot(state.slot, 'pgoutput');
    END IF;
    -- Until outbox_log_recover has run, whatever stops the relay now. This statement's snapshot
    -- is taken after the slot was made, so every transaction it does not see commits after the
    -- slot's consistent point.
    UPDATE @extschema@.outbox_log_state
       SET recovering = true, slot_made = pg_current_snapshot(), slot_ours = true, slot_wanted_from = NULL;
    RETURN true;
END
$$;

REVOKE ALL ON FUNCTION @extschema@.outbox_log_make_slot(bigint) FROM PUBLIC;
