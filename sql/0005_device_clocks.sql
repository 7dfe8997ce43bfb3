-- Device clock offsets (received_time - sent_time, BRIEF §1), one row per (app, device) per micro-batch of the
-- dead_letters query, which sees every record. Keyed by batch, so a replayed batch writes the same rows again.
CREATE TABLE IF NOT EXISTS device_clocks
(
    app                String,
    device             String,
    batch_id           UInt64,
    events             UInt64,
    offset_min_ms      Int64,
    offset_max_ms      Int64,
    offset_avg_ms      Float64,
    last_received      DateTime64(3, 'UTC'),
    recorded_at        DateTime64(3, 'UTC')
)
ENGINE = ReplacingMergeTree
PARTITION BY toYYYYMM(last_received)
ORDER BY (app, device, batch_id)
TTL toDateTime(last_received) + INTERVAL 30 DAY;   -- one row per device and batch: keep a month
