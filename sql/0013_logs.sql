-- Every accepted log line, readable: written by the stream job's accept stage from its first copies (after dedup,
-- so a re-sent event is stored once), with the corrected event time the windows use and the raw device time.
-- Stragglers are stored like any line (a closed window drops a contribution, never a line); the Logs page marks a
-- line late when its event id is in `stragglers`.
--
-- Exactly once: the table is a plain MergeTree (no FINAL, which a search over millions of lines cannot afford) with
-- insert deduplication. A micro-batch replayed after a crash sends the very same block (same first copies, same
-- order, no wall-clock column), which ClickHouse recognises by its hash among the table's last
-- `non_replicated_deduplication_window` inserts and skips. A replicated table on a cluster does this by default.
--
-- Laid out for log search the way ClickHouse's own log schemas (the OpenTelemetry exporter's) are:
--   * ORDER BY (app, level, corrected_event_time): a page's filters are an app, a level and a range, so a search
--     reads the primary-key ranges of that app and level only; the time range then prunes within them.
--   * PARTITION BY day: the TTL (set from [retention] logs_days by store/migrations.py) drops whole parts
--     (ttl_only_drop_parts) instead of rewriting them, and a range reads only its days.
--   * A token bloom filter on lowerUTF8(message): a word search (hasToken on the same expression) skips every
--     granule that cannot hold the word; the search is case-insensitive because the index is on the lowered text.
--   * Bloom filters on the tag keys and values (`tags['k'] = 'v'` skips granules) and on the event id.
--   * LowCardinality for the columns with few distinct values (app, level, logger name, tag keys).
--   * ZSTD(1) on the wide columns, as ClickHouse's own log schemas declare it: a server compresses with LZ4 unless
--     told otherwise, about twice the bytes per line here, for no faster search (docs/performance.md).
CREATE TABLE IF NOT EXISTS logs
(
    corrected_event_time  DateTime64(3, 'UTC') CODEC(ZSTD(1)),   -- event_time + received - sent: the windows' time
    event_time            DateTime64(3, 'UTC') CODEC(ZSTD(1)),   -- as the device's clock said
    received_time         DateTime64(3, 'UTC') CODEC(ZSTD(1)),   -- server clock
    app                   LowCardinality(String),
    level                 LowCardinality(String),
    name                  LowCardinality(String), -- the logger
    device                String CODEC(ZSTD(1)),
    user                  String CODEC(ZSTD(1)),                 -- '' when the event had none
    message               String CODEC(ZSTD(1)),
    tags                  Map(LowCardinality(String), String) CODEC(ZSTD(1)),
    event_id              String CODEC(ZSTD(1)),
    source_partition      Int32,
    source_offset         Int64,
    INDEX message_tokens lowerUTF8(message) TYPE tokenbf_v1(32768, 3, 0) GRANULARITY 1,
    INDEX tag_keys mapKeys(tags) TYPE bloom_filter(0.01) GRANULARITY 1,
    INDEX tag_values mapValues(tags) TYPE bloom_filter(0.01) GRANULARITY 1,
    INDEX event_ids event_id TYPE bloom_filter(0.01) GRANULARITY 1
)
ENGINE = MergeTree
PARTITION BY toDate(corrected_event_time)
ORDER BY (app, level, corrected_event_time)
SETTINGS non_replicated_deduplication_window = 1000, ttl_only_drop_parts = 1;
