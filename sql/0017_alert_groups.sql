-- Group notifications (alerting.grouping): one row per flush that notified a receiver about a group of alerts, as
-- Alertmanager's notification log keeps them. The newest row per (receiver, group_key) is what that receiver
-- last knew (which alerts firing, which resolved, when): a restarted evaluator notifies nothing it already has.
-- The body is the payload as it is sent; alerts = 0 marks a row recorded but not sent (an all-clear to a receiver
-- without send_resolved). Deliveries and failures are recorded in alert_notifications / alert_delivery_failures
-- under the receiver's channel, 'receiver:<name>'.
CREATE TABLE IF NOT EXISTS alert_group_notifications
(
    notification_key     String,                  -- receiver|group_key|decided at (ms)
    receiver             String,
    group_key            String,                  -- route key:group labels, e.g. {}:{alertname="slow"}
    status               LowCardinality(String),  -- firing | resolved
    firing               Array(String),           -- fingerprints of the alerts notified as firing
    resolved             Array(String),           -- fingerprints of the alerts notified as resolved
    alerts               UInt32,                  -- alerts in the body
    body                 String,
    decided_at           DateTime64(3, 'UTC')
)
ENGINE = ReplacingMergeTree
ORDER BY (receiver, group_key, decided_at);
