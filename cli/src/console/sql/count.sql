-- How many deliveries an events filter matches, counted up to $10 (a bigger number is shown as
-- "more than"): exact where it is cheap, bounded where it is not.
WITH
--@include bounds.sql
SELECT pg_catalog.count(*)
  FROM (SELECT
--@include filter.sql
         LIMIT $10::bigint) AS matched
