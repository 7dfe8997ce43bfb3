-- Hopping windows share window_aggregates with tumbling ones; the hop tells two hopping windowings of the same
-- length apart. The job writes hop = length for tumbling rows (rows written before this migration read 0).
ALTER TABLE window_aggregates
    ADD COLUMN IF NOT EXISTS window_hop_ms UInt64 AFTER window_length_ms,
    MODIFY ORDER BY (window_kind, window_length_ms, app, kind, name, series_tags, window_start, window_hop_ms);

-- One row per stateful query and micro-batch, as Spark reports it. `watermark` is the watermark the batch ran
-- with: once a batch is recorded, windows of that query ending at or before it are final.
-- `rows_dropped_by_watermark` is Spark's own figure (partially aggregated rows, a signal only; the exact
-- straggler count is in `stragglers`).
CREATE TABLE IF NOT EXISTS pipeline_progress
(
    query_name                 LowCardinality(String),
    query_id                   String,
    run_id                     String,
    batch_id                   UInt64,
    batch_timestamp            DateTime64(3, 'UTC'),
    watermark                  DateTime64(3, 'UTC'),
    input_rows                 UInt64,
    input_rows_per_second      Float64,
    processed_rows_per_second  Float64,
    rows_dropped_by_watermark  UInt64,
    state_rows                 UInt64,
    state_memory_bytes         UInt64,
    duration_ms                UInt64,
    durations                  String,             -- JSON: Spark's durationMs breakdown
    sources                    String,             -- JSON: start/end/latest offsets per source
    recorded_at                DateTime64(3, 'UTC')
)
ENGINE = ReplacingMergeTree(recorded_at)
ORDER BY (query_name, query_id, batch_id);

-- Latest watermark per query: the finality clock readers compare window ends with.
CREATE VIEW IF NOT EXISTS query_watermarks AS
SELECT query_name, max(watermark) AS watermark, max(recorded_at) AS recorded_at
FROM pipeline_progress
GROUP BY query_name;

-- Window rows with their finality: final once the watermark of the query that computed them reached their end.
CREATE VIEW IF NOT EXISTS window_results AS
SELECT w.*, w.window_end <= q.watermark AS is_final
FROM window_aggregates AS w FINAL
LEFT JOIN (SELECT watermark FROM query_watermarks WHERE query_name = 'windows') AS q ON 1 = 1;

-- Dropped stragglers: one row per dropped contribution of an event to a window that was already closed when it
-- arrived (BRIEF §3), keyed by the event's Kafka position so a replayed micro-batch adds nothing. A hopping
-- event can appear once per closed window; count(DISTINCT source_partition, source_offset) counts events.
CREATE TABLE IF NOT EXISTS stragglers
(
    window_kind            LowCardinality(String),   -- tumbling | hopping | sliding | session
    window_length_ms       UInt64,                   -- L, or the gap G for sessions
    window_hop_ms          UInt64,
    app                    String,
    kind                   LowCardinality(String),
    name                   String,                   -- series name; for sessions the session key
    series_tags            String,
    window_start           DateTime64(3, 'UTC'),
    window_end             DateTime64(3, 'UTC'),
    source_partition       Int32,
    source_offset          Int64,
    event_id               String,
    device                 String,
    corrected_event_time   DateTime64(3, 'UTC'),
    watermark              DateTime64(3, 'UTC'),     -- the watermark the event was judged against
    lateness_ms            Int64,                    -- watermark - corrected_event_time
    query_name             LowCardinality(String),
    batch_id               UInt64,
    detected_at            DateTime64(3, 'UTC')
)
ENGINE = ReplacingMergeTree(batch_id)
PARTITION BY toYYYYMM(window_start)
ORDER BY (window_kind, window_length_ms, window_hop_ms, app, kind, name, series_tags, window_start,
          source_partition, source_offset);

-- Sliding windows (BRIEF §2): for each accepted event e of a configured series, the trailing window
-- (t_e - L, t_e], written once the watermark reached t_e. Keyed by the event's Kafka position.
CREATE TABLE IF NOT EXISTS sliding_windows
(
    window_length_ms  UInt64,
    app               String,
    kind              LowCardinality(String),
    name              String,
    series_tags       String,
    window_start      DateTime64(3, 'UTC'),   -- exclusive: t_e - L
    window_end        DateTime64(3, 'UTC'),   -- inclusive: t_e
    source_partition  Int32,
    source_offset     Int64,
    event_id          String,
    event_count       UInt64,
    value_count       UInt64,
    sum               Float64,
    min               Nullable(Float64),
    max               Nullable(Float64),
    mean              Nullable(Float64),
    rate              Float64,                -- events per second of window length
    level_debug       UInt64,
    level_info        UInt64,
    level_warning     UInt64,
    level_error       UInt64,
    level_critical    UInt64,
    version           UInt64,
    written_at        DateTime64(3, 'UTC')
)
ENGINE = ReplacingMergeTree(version)
PARTITION BY toYYYYMM(window_end)
ORDER BY (window_length_ms, app, kind, name, series_tags, window_end, source_partition, source_offset);

-- Session windows (BRIEF §2): per (app, user), or (app, device) for events without a user; a maximal run of
-- events each less than G after the previous, [first, last + G), written once the watermark reached last + G.
CREATE TABLE IF NOT EXISTS sessions
(
    gap_ms            UInt64,
    app               String,
    key_kind          LowCardinality(String),  -- user | device
    session_key       String,
    session_start     DateTime64(3, 'UTC'),    -- first event
    session_end       DateTime64(3, 'UTC'),    -- last event + G
    last_event_time   DateTime64(3, 'UTC'),
    duration_ms       UInt64,                  -- last event - first event
    event_count       UInt64,
    metric_count      UInt64,
    log_count         UInt64,
    level_debug       UInt64,
    level_info        UInt64,
    level_warning     UInt64,
    level_error       UInt64,
    level_critical    UInt64,
    version           UInt64,
    written_at        DateTime64(3, 'UTC')
)
ENGINE = ReplacingMergeTree(version)
PARTITION BY toYYYYMM(session_start)
ORDER BY (gap_ms, app, key_kind, session_key, session_start);
