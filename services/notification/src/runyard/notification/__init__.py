"""The notification service: Feishu alerts about tasks (SPEC R-50).

Shape, as every service: `rules` (pure: which events raise which alerts, who
wants them), `feishu` (pure: bodies, signing, fitting in 20 KB, answers),
`ratelimit` (Feishu's per-bot limits, shared by all instances), `store`
(tables), `app` (the application layer: reactions, the queue timer,
delivery and audit), `subscriptions` (the API's use cases), `rebuild`
(`queue_waits` rebuilt from the log beside the live one), the edges `http`
(router the gateway includes) and `main` (`async def run(ctx)`). See
docs/notifications.md.
"""

from runyard.contracts.spec import ALERT_KINDS
from runyard.notification.app import NotificationApp, NotificationConfig
from runyard.notification.feishu import AlertFacts
from runyard.notification.ratelimit import Limits, SharedLimiter
from runyard.notification.rules import Subscription

__all__ = [
    "ALERT_KINDS",
    "AlertFacts",
    "Limits",
    "NotificationApp",
    "NotificationConfig",
    "SharedLimiter",
    "Subscription",
]
