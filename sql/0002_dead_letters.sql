-- Records the job could not accept, with the reason. Keyed by their Kafka position, so a replayed
-- micro-batch does not count a record twice.
CREATE TABLE IF NOT EXISTS dead_letters
(
    source_topic      String,
    source_partition  Int32,
    source_offset     Int64,
    kafka_timestamp   DateTime64(3, 'UTC'),
    reason            String,
    raw               String,              -- the record value (truncated to the envelope size limit)
    raw_bytes         UInt64,              -- full size of the record value
    detected_at       DateTime64(3, 'UTC')
)
ENGINE = ReplacingMergeTree
PARTITION BY toYYYYMM(kafka_timestamp)
ORDER BY (source_topic, source_partition, source_offset);
