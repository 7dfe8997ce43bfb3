-- Alert notifications that could not be delivered: one row per (transition, channel) that failed permanently
-- (a 4xx answer other than 408/429, a payload that cannot be encoded, attempts or deadline exhausted). The
-- notifier never tries such a notification again, and goes on with the next one; the Alerts page lists them.
-- Rule, series and state are copied from the transition so the row reads on its own.
CREATE TABLE IF NOT EXISTS alert_delivery_failures
(
    transition_key       String,
    channel              LowCardinality(String),  -- webhook | kafka
    rule                 String,
    series               String,
    to_state             LowCardinality(String),  -- firing | resolved
    window_end           DateTime64(3, 'UTC'),
    reason               String,                  -- why it was given up, e.g. "webhook answered 400 Bad Request"
    attempts             UInt32,                  -- attempts made (0: the payload could not be encoded)
    last_status          Nullable(UInt16),        -- HTTP status of the last answer; NULL: no answer (timeout, reset)
    failed_at            DateTime64(3, 'UTC')
)
ENGINE = ReplacingMergeTree(failed_at)
ORDER BY (transition_key, channel);
