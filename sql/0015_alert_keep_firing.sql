-- keep_firing_for: a firing alert counts its consecutive calm (non-breaching) finished windows, and resolves only
-- once they exceed the rule's keep_firing_for. States written before this column read as 0: no calm window yet.
ALTER TABLE alert_states ADD COLUMN IF NOT EXISTS calm UInt32 DEFAULT 0 AFTER breaches;
