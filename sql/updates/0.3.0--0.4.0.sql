-- outbox_ext 0.3.0 -> 0.4.0. Run by ALTER EXTENSION outbox_ext UPDATE; every row stays.
--
-- This is the source of sql/outbox_ext--0.3.0--0.4.0.sql, assembled as the earlier updates are
-- (scripts/cluster.sh: each "--@include FILE" line becomes sql/FILE). Each change 0.4.0 makes
-- to the schema or a function comes here with it: the test
-- upgrade::updating_from_every_release_since_0_2_0_keeps_every_row_and_ends_as_a_fresh_install
-- fails while 0.3.0 updated differs from a fresh install.

\echo Use "ALTER EXTENSION outbox_ext UPDATE" to load this file. \quit

-- From PostgreSQL 17 on, the log's slot is made a failover slot, which a standby that
-- synchronises slots keeps through a promotion. A slot made before stays as it is.
--@include log_slot.sql
