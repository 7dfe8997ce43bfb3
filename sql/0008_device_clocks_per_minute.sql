-- Device clocks per minute, for the dashboard: each device's newest offset in each minute of `last_received`.
-- The job writes one device_clocks row per device and micro-batch (17,280 a day per device at a 5 s trigger); the
-- Stragglers page wants each device's newest offset over a range, which whole minutes answer from 1,440 rows a day
-- per device (the partial minutes at the range's ends come from device_clocks itself).
-- Only argMax / max states: a replayed micro-batch (same rows again) or the backfill below overlapping rows the
-- view already saw changes nothing, so this stays exact without FINAL. (A sum of events would count them twice.)
CREATE TABLE IF NOT EXISTS device_clocks_per_minute
(
    minute          DateTime('UTC'),
    app             String,
    device          String,
    newest_offset   AggregateFunction(argMax, Float64, DateTime64(3, 'UTC')),  -- offset_avg_ms at max last_received
    newest_received SimpleAggregateFunction(max, DateTime64(3, 'UTC'))
)
ENGINE = AggregatingMergeTree
PARTITION BY toYYYYMM(minute)
ORDER BY (minute, app, device)
TTL minute + INTERVAL 30 DAY;   -- as device_clocks

CREATE MATERIALIZED VIEW IF NOT EXISTS device_clocks_per_minute_mv TO device_clocks_per_minute AS
SELECT toStartOfMinute(last_received) AS minute, app, device,
       argMaxState(offset_avg_ms, last_received) AS newest_offset, max(last_received) AS newest_received
FROM device_clocks
GROUP BY minute, app, device;

-- Rows written before the view existed. Running this again (or overlapping the view) is harmless: see above.
INSERT INTO device_clocks_per_minute
SELECT toStartOfMinute(last_received) AS minute, app, device,
       argMaxState(offset_avg_ms, last_received) AS newest_offset, max(last_received) AS newest_received
FROM device_clocks
GROUP BY minute, app, device;

-- The partial minutes at a range's ends are read from device_clocks, whose sort key (app, device, batch_id) says
-- nothing about time: a minmax index on last_received skips the granules outside them.
ALTER TABLE device_clocks ADD INDEX IF NOT EXISTS last_received_minmax last_received TYPE minmax GRANULARITY 1;

ALTER TABLE device_clocks MATERIALIZE INDEX last_received_minmax;
