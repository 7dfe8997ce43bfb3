-- The newest watermark of each streaming query, kept as progress rows arrive. query_watermarks aggregated all of
-- pipeline_progress on every read (one row per query and micro-batch, ~17,000 a day per query, never deleted),
-- and window_results joins it, so every range query and dashboard chart paid for the whole history.
-- max is idempotent: a replayed batch's row, or the backfill below overlapping the view, changes nothing.
CREATE TABLE IF NOT EXISTS query_watermarks_kept
(
    query_name   LowCardinality(String),
    watermark    SimpleAggregateFunction(max, DateTime64(3, 'UTC')),
    recorded_at  SimpleAggregateFunction(max, DateTime64(3, 'UTC'))
)
ENGINE = AggregatingMergeTree
ORDER BY query_name;

CREATE MATERIALIZED VIEW IF NOT EXISTS query_watermarks_kept_mv TO query_watermarks_kept AS
SELECT query_name, max(watermark) AS watermark, max(recorded_at) AS recorded_at
FROM pipeline_progress
GROUP BY query_name;

INSERT INTO query_watermarks_kept
SELECT query_name, max(watermark) AS watermark, max(recorded_at) AS recorded_at
FROM pipeline_progress
GROUP BY query_name;

-- Same columns and answer as 0003's definition (max over every progress row of the query), from the kept maxima.
CREATE OR REPLACE VIEW query_watermarks AS
SELECT query_name, max(watermark) AS watermark, max(recorded_at) AS recorded_at
FROM query_watermarks_kept
GROUP BY query_name;
