-- Alerting: the state of every (rule, series), the history of transitions, and which notifications were delivered.

-- Latest state per (rule, series): the newest evaluated window wins, so re-running an evaluation is harmless.
CREATE TABLE IF NOT EXISTS alert_states
(
    rule                 String,
    series               String,                  -- SeriesKey label, or 'pipeline' for pipeline statistics
    state                LowCardinality(String),  -- ok | pending | firing
    breaches             UInt32,                  -- consecutive breaching finished windows
    evaluated_until      DateTime64(3, 'UTC'),    -- end of the newest finished window evaluated
    since                DateTime64(3, 'UTC'),    -- end of the window that entered this state
    value                Nullable(Float64),       -- the statistic of the newest evaluated window
    threshold            Float64,
    severity             LowCardinality(String),
    updated_at           DateTime64(3, 'UTC')
)
ENGINE = ReplacingMergeTree(evaluated_until)
ORDER BY (rule, series);

-- Every transition (pending, firing, resolved, ok), keyed by rule, series, target state and window: stable
-- across restarts, so a re-evaluation writes the same row again instead of a second one.
CREATE TABLE IF NOT EXISTS alert_transitions
(
    transition_key       String,
    rule                 String,
    series               String,
    to_state             LowCardinality(String),
    window_end           DateTime64(3, 'UTC'),
    value                Nullable(Float64),
    threshold            Float64,
    severity             LowCardinality(String),
    notify               UInt8,                   -- 1 for firing and resolved
    recorded_at          DateTime64(3, 'UTC')
)
ENGINE = ReplacingMergeTree
ORDER BY transition_key;

-- One row per (transition, channel) once delivered: what makes "no duplicate notification" hold across restarts.
CREATE TABLE IF NOT EXISTS alert_notifications
(
    transition_key       String,
    channel              LowCardinality(String),  -- webhook | kafka
    attempts             UInt32,
    delivered_at         DateTime64(3, 'UTC')
)
ENGINE = ReplacingMergeTree
ORDER BY (transition_key, channel);
