-- What the console's role may read and do, by the privilege the database checks for each
-- ($1: the outbox's schema, quoted). The console offers only what is true here, and the
-- database refuses the rest anyway.
SELECT pg_catalog.json_build_object(
           'role', current_user,
           'read', pg_catalog.json_build_object(
               'endpoints', pg_catalog.has_function_privilege($1 || '.outbox_endpoint_stats()', 'EXECUTE')
                            AND pg_catalog.has_column_privilege($1 || '.outbox_endpoints', 'disabled_reason', 'SELECT'),
               'urls',      pg_catalog.has_column_privilege($1 || '.outbox_endpoints', 'url', 'SELECT'),
               'events',    pg_catalog.has_table_privilege($1 || '.outbox', 'SELECT')
                            AND pg_catalog.has_table_privilege($1 || '.outbox_deliveries', 'SELECT'),
               'relays',    pg_catalog.has_function_privilege($1 || '.outbox_relay_processes()', 'EXECUTE'),
               'leases',    pg_catalog.has_function_privilege($1 || '.outbox_leases()', 'EXECUTE')),
           'act', pg_catalog.json_build_object(
               'requeue', pg_catalog.has_function_privilege($1 || '.outbox_requeue(bigint, text)', 'EXECUTE'),
               'skip',    pg_catalog.has_function_privilege($1 || '.outbox_skip(text, bigint)', 'EXECUTE'),
               'replay',  pg_catalog.has_function_privilege($1 || '.outbox_replay(text, timestamptz, timestamptz)', 'EXECUTE'),
               'endpoint_set', pg_catalog.has_function_privilege(
                               $1 || '.outbox_endpoint_set(text, text, text[], text, jsonb, interval, integer, integer, boolean, boolean)', 'EXECUTE'),
               'rotate',  pg_catalog.has_function_privilege($1 || '.outbox_endpoint_rotate_secret(text, text, interval)', 'EXECUTE'),
               'disable', pg_catalog.has_function_privilege($1 || '.outbox_endpoint_disable(text, text)', 'EXECUTE'),
               'enable',  pg_catalog.has_function_privilege($1 || '.outbox_endpoint_enable(text)', 'EXECUTE'),
               'drop',    pg_catalog.has_function_privilege($1 || '.outbox_endpoint_drop(text)', 'EXECUTE'),
               'extend',  pg_catalog.has_function_privilege($1 || '.outbox_extend(text, bigint, integer, interval)', 'EXECUTE'),
               'nack',    pg_catalog.has_function_privilege($1 || '.outbox_nack(text, bigint, integer, text, interval)', 'EXECUTE')))::text
