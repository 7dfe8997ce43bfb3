-- Silences (alerting.silences): while one is active, the alerts its matchers match are not notified to receivers;
-- they are still evaluated, stored and shown. Expiring a silence writes it again with ends_at = now (the newest
-- row per silence_id wins).
CREATE TABLE IF NOT EXISTS alert_silences
(
    silence_id           String,
    matchers             Array(String),           -- Alertmanager's matchers, e.g. app="checkout", severity=~"warn.*"
    starts_at            DateTime64(3, 'UTC'),
    ends_at              DateTime64(3, 'UTC'),
    created_by           String,
    comment              String,
    updated_at           DateTime64(3, 'UTC')
)
ENGINE = ReplacingMergeTree(updated_at)
ORDER BY silence_id;
