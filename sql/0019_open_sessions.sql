-- Sessions in progress (issue 54): one provisional row per open session, keyed by (session key, start) like the
-- final rows in `sessions`. A newer version of the same row replaces it while the session grows; a row with
-- is_open = 0 retires it, written when the session closes (its final row goes to `sessions` in the same batch) or
-- when a late run merges it into a session that starts earlier. Read open sessions as
-- `SELECT ... FROM open_sessions FINAL WHERE is_open`.
CREATE TABLE IF NOT EXISTS open_sessions
(
    gap_ms            UInt64,
    app               String,
    key_kind          LowCardinality(String),  -- user | device
    session_key       String,
    session_start     DateTime64(3, 'UTC'),    -- first event so far
    session_end       DateTime64(3, 'UTC'),    -- last event so far + G: when it closes if nothing else arrives
    last_event_time   DateTime64(3, 'UTC'),
    duration_ms       UInt64,                  -- last event - first event, so far
    event_count       UInt64,
    metric_count      UInt64,
    log_count         UInt64,
    level_debug       UInt64,
    level_info        UInt64,
    level_warning     UInt64,
    level_error       UInt64,
    level_critical    UInt64,
    is_open           UInt8,
    version           UInt64,                  -- the keyed_windows batch that wrote it
    written_at        DateTime64(3, 'UTC')
)
ENGINE = ReplacingMergeTree(version)
ORDER BY (gap_ms, app, key_kind, session_key, session_start);
