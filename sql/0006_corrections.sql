-- Corrections (BRIEF §3): late events (behind the watermark) whose tumbling/hopping window was still open, so
-- the window was published again with them. One row per (window, micro-batch), so a replayed batch adds nothing.
CREATE TABLE IF NOT EXISTS corrections
(
    window_kind        LowCardinality(String),
    window_length_ms   UInt64,
    window_hop_ms      UInt64,
    app                String,
    kind               LowCardinality(String),
    name               String,
    series_tags        String,
    window_start       DateTime64(3, 'UTC'),
    window_end         DateTime64(3, 'UTC'),
    batch_id           UInt64,
    late_events        UInt64,
    max_lateness_ms    Int64,
    detected_at        DateTime64(3, 'UTC')
)
ENGINE = ReplacingMergeTree
PARTITION BY toYYYYMM(window_start)
ORDER BY (window_kind, window_length_ms, window_hop_ms, app, kind, name, series_tags, window_start, batch_id);
