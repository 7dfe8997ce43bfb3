-- The dedup memory is held by the accept query's driver (the horizon's accepted ids, kept between batches):
-- its size per batch, beside the size of the accepted-events files it can be rebuilt from (horizon_bytes).
ALTER TABLE dedup_state ADD COLUMN IF NOT EXISTS horizon_memory_bytes UInt64 DEFAULT 0 AFTER horizon_bytes;
