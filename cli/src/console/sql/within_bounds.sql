-- The walk between the bounds of sql/bounds.sql, the last conditions of sql/filter.sql. Each
-- bound holds every delivery the filter matches, so these change no row it matches, only how
-- far the walk goes; the planner's estimate of a filter leaves them out, as it cannot see the
-- bounds' values and would guess far too few rows.
   AND ($1::text IS NULL OR $1 OPERATOR(pg_catalog.<>) ALL ('{pending,waiting}')
        OR d.event_id OPERATOR(pg_catalog.>=) (SELECT s.first_id FROM filter_state AS s))
   AND ($7::text IS NULL OR $8::text IS NULL
        OR d.event_id OPERATOR(pg_catalog.>=) (SELECT w.first_id FROM filter_window AS w))
   AND ($7::text IS NULL OR $8::text IS NULL
        OR d.event_id OPERATOR(pg_catalog.<=) (SELECT w.last_id FROM filter_window AS w))
