-- One row per (window, series). The streaming job writes a window again whenever a micro-batch changes it
-- (early results, then corrections from late events); `version` (the micro-batch id) orders those writes and
-- ReplacingMergeTree keeps the newest, so readers use FINAL and never double count. A replayed micro-batch
-- writes the same rows with the same version: no duplicates.
CREATE TABLE IF NOT EXISTS window_aggregates
(
    window_kind       LowCardinality(String),
    window_length_ms  UInt64,
    window_start      DateTime64(3, 'UTC'),
    window_end        DateTime64(3, 'UTC'),
    app               String,
    kind              LowCardinality(String),
    name              String,
    series_tags       String,              -- configured tag keys as "k=v,k=v" (sorted), '' when none
    event_count       UInt64,
    value_count       UInt64,              -- metric events with a value (logs have none)
    sum               Float64,
    min               Nullable(Float64),
    max               Nullable(Float64),
    mean              Nullable(Float64),
    rate              Float64,             -- events per second of window length
    p50               Nullable(Float64),
    p90               Nullable(Float64),
    p95               Nullable(Float64),
    p99               Nullable(Float64),
    p999              Nullable(Float64),
    distinct_users    UInt64,
    distinct_devices  UInt64,
    value_sketch      String,              -- KLL doubles sketch (DataSketches bytes), '' when no values
    users_sketch      String,              -- HLL sketch of `user`
    devices_sketch    String,              -- HLL sketch of `device`
    level_debug       UInt64,
    level_info        UInt64,
    level_warning     UInt64,
    level_error       UInt64,
    level_critical    UInt64,
    version           UInt64,
    written_at        DateTime64(3, 'UTC')
)
ENGINE = ReplacingMergeTree(version)
PARTITION BY toYYYYMM(window_start)
ORDER BY (window_kind, window_length_ms, app, kind, name, series_tags, window_start);
