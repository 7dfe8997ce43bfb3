-- Provisional open sessions (issue 50): between the keyed_windows query's batches, accept's driver writes the
-- sessions in progress of the session keys each accept batch touched (analytics/keyed/provisional.py), into
-- open_sessions beside the query's own rows, marked `provisional`. Versions order them: the query writes 2c + 1,
-- c being the newest accept batch its micro-batch took; a provisional row written at accept batch k has 2k.
-- A provisional row stands only until the query has taken batch k: from then on the query's rows say what is open
-- for that key (it rewrites every open session of a key it touched), and a provisional session it did not confirm
-- (say, a start a late run moved) must not linger. Read open sessions from open_sessions_now.
ALTER TABLE open_sessions ADD COLUMN IF NOT EXISTS provisional UInt8 DEFAULT 0 AFTER is_open;

-- The newest version of the keyed_windows query's open-session rows, 2c + 1 (one row, kept as rows arrive).
CREATE TABLE IF NOT EXISTS keyed_sessions_covered
(
    version  SimpleAggregateFunction(max, UInt64)
)
ENGINE = AggregatingMergeTree
ORDER BY tuple();

CREATE MATERIALIZED VIEW IF NOT EXISTS keyed_sessions_covered_mv TO keyed_sessions_covered AS
SELECT max(version) AS version
FROM open_sessions
WHERE provisional = 0;

-- Sessions open now: the query's rows, and the provisional rows of accept batches it has not taken yet
-- (2k >= 2c + 1 exactly when k > c; all of them before the query's first row, max of nothing being 0).
CREATE OR REPLACE VIEW open_sessions_now AS
SELECT *
FROM open_sessions FINAL
WHERE is_open AND (provisional = 0 OR version >= (SELECT max(version) FROM keyed_sessions_covered));
