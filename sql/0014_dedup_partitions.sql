-- The dedup state per accept micro-batch and Kafka partition: each partition's records are deduplicated in the
-- Spark task that reads it, against the ids that partition accepted within the horizon (analytics/accept/dedup.py),
-- held in that task's process. Per partition: the ids and file bytes of its horizon, the memory its ids held, and
-- what the batch accepted from it, dropped as duplicates and dead-lettered. dedup_state keeps the batch's totals.
CREATE TABLE IF NOT EXISTS dedup_partitions
(
    batch_id              UInt64,
    source_partition      Int32,
    horizon_ms            UInt64,
    horizon_ids           UInt64,
    horizon_bytes         UInt64,
    horizon_memory_bytes  UInt64,
    accepted              UInt64,
    duplicates            UInt64,
    dead_letters          UInt64,
    recorded_at           DateTime64(3, 'UTC')
)
ENGINE = ReplacingMergeTree(recorded_at)
ORDER BY (batch_id, source_partition);
