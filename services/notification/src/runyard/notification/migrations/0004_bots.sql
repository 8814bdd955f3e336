-- Per bot (webhook URL), shared by every instance of the service.
--
-- `alert_bots`: a bot whose last attempt failed and may be tried again (it was
-- unreachable, answered 5xx, or Feishu's 11232 "too fast"): since when, how many
-- attempts in a row failed, and when the next may go (capped exponential
-- backoff). Its pending alerts wait behind the first of them until then, so
-- they go in order when it is back; the row goes when the bot answers.
CREATE TABLE IF NOT EXISTS alert_bots (
    webhook_url text        PRIMARY KEY,
    failures    integer     NOT NULL,
    down_since  timestamptz NOT NULL,
    retry_at    timestamptz NOT NULL
);

-- `alert_bot_sends`: the requests sent to each bot in the last minute (when each
-- was answered, by Postgres's clock): Feishu's limits (5/s, 100/min) are per bot,
-- so every instance takes its tokens here.
CREATE TABLE IF NOT EXISTS alert_bot_sends (
    id          bigserial   PRIMARY KEY,
    webhook_url text        NOT NULL,
    sent_at     timestamptz NOT NULL
);
CREATE INDEX IF NOT EXISTS alert_bot_sends_bot ON alert_bot_sends (webhook_url, sent_at);

CREATE INDEX IF NOT EXISTS alert_outbox_bot_pending
    ON alert_outbox (webhook_url) WHERE status = 'pending';
