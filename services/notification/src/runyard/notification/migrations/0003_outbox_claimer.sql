-- Who holds a claimed outbox row: the claiming instance's presence key
-- (runyard.stack.leader.Presence), NULL when nobody does. A row whose claimer's
-- presence has ended (the instance died mid-pass) is due again at once, not
-- when its claim (`claim_s`) runs out.
ALTER TABLE alert_outbox ADD COLUMN IF NOT EXISTS claimed_by bigint;
CREATE INDEX IF NOT EXISTS alert_outbox_claimed
    ON alert_outbox (claimed_by) WHERE claimed_by IS NOT NULL AND status = 'pending';
