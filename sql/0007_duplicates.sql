-- Duplicates: valid records whose event id was already accepted (earlier in the same micro-batch, or within the
-- dedup horizon before it). Ignored by every window; one row per duplicate record, keyed by its Kafka position
-- so a replayed micro-batch adds nothing. Per app and minute: count() grouped by app, toStartOfMinute(kafka_timestamp).
CREATE TABLE IF NOT EXISTS duplicates
(
    source_topic      String,
    source_partition  Int32,
    source_offset     Int64,
    kafka_timestamp   DateTime64(3, 'UTC'),  -- when the duplicate reached the broker
    event_id          String,
    app               String,
    device            String,
    batch_id          UInt64,                -- the accept micro-batch that dropped it
    detected_at       DateTime64(3, 'UTC')
)
ENGINE = ReplacingMergeTree
PARTITION BY toYYYYMM(kafka_timestamp)
ORDER BY (source_topic, source_partition, source_offset);

-- The dedup state per accept micro-batch: how many accepted ids the horizon held when the batch was checked,
-- and what the batch accepted, dropped as duplicates and dead-lettered.
CREATE TABLE IF NOT EXISTS dedup_state
(
    batch_id          UInt64,
    horizon_ms        UInt64,
    horizon_ids       UInt64,                -- accepted ids the batch was checked against
    horizon_bytes     UInt64,                -- size of the accepted-events files holding them
    accepted          UInt64,
    duplicates        UInt64,
    dead_letters      UInt64,
    recorded_at       DateTime64(3, 'UTC')
)
ENGINE = ReplacingMergeTree(recorded_at)
ORDER BY batch_id;
