-- Every alert transition carries its alert's labels (alertname, severity, the series' app, kind and name, the
-- rule's own labels) and annotations (summary, description, the rule's own), as JSON objects of strings:
-- what notifications send and what routes and silences will match. Rows written before read as {}.
ALTER TABLE alert_transitions ADD COLUMN IF NOT EXISTS labels String DEFAULT '{}';
ALTER TABLE alert_transitions ADD COLUMN IF NOT EXISTS annotations String DEFAULT '{}';
