-- Records the job never read because Kafka had deleted them first (retention reached the job's position: an outage
-- longer than kafka.events_retention_ms). The job reads on (failOnDataLoss=false: the records are gone either way)
-- and writes here each gap of offsets it skipped, one row per (topic, partition, first skipped offset), so a
-- replayed micro-batch adds nothing. Offsets, not events: a gap may also hold transaction markers.
-- Every table's TTL is set from the configuration ([retention]) by store/migrations.py after the files.
CREATE TABLE IF NOT EXISTS kafka_data_loss
(
    topic             String,
    partition         Int32,
    from_offset       Int64,                 -- first offset skipped
    to_offset         Int64,                 -- first offset read after the gap (exclusive end)
    skipped_offsets   UInt64,
    query_name        LowCardinality(String),
    batch_id          UInt64,
    detected_at       DateTime64(3, 'UTC')
)
ENGINE = ReplacingMergeTree
ORDER BY (topic, partition, from_offset);
