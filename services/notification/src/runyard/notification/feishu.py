"""The Feishu (Lark) custom-bot webhook: message bodies, signing, and what an answer means.

A custom bot takes `POST <webhook>` with a JSON body of at most 20 KB:
an interactive card (`msg_type: interactive`) or plain text (`msg_type:
text`). With a signing secret the body also carries `timestamp` (seconds)
and `sign`: base64 of HMAC-SHA256 keyed by `timestamp + "\\n" + secret`
over an empty message. The answer is JSON with `code` (0 = accepted; older
bots answer `StatusCode`) and `msg`.

Everything here is pure: no clock (the timestamp comes in), no I/O.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

#: Feishu's body limit for a custom bot.
MAX_BODY_BYTES = 20 * 1024
#: Feishu codes: rate limited (retry later), bad signature or timestamp, bad request.
RATE_LIMITED, SIGN_MISMATCH, BAD_REQUEST = 11232, 19021, 9499
_RETRYABLE_CODES = frozenset({RATE_LIMITED})
#: What a Feishu code means, in fixed words (the answer's own `msg` is never kept).
FEISHU_REASONS = {
    RATE_LIMITED: "rate limited",
    SIGN_MISMATCH: "signature or timestamp rejected (sign match fail): check the secret",
    BAD_REQUEST: "bad request (body, size or message type)",
    19022: "the bot's IP allow-list refused the request",
    19024: "the message lacks the bot's security keywords",
}
REDIRECT_REFUSED = "redirect not followed (a webhook must be the bot's own URL)"
_ELLIPSIS = "…"
#: Longest text kept for one fact (reason, first error) before the body-size fit.
MAX_FACT_CHARS = 2000
#: Longest log line a card shows for the first error (a log line can be megabytes).
MAX_LINE_CHARS = 500
#: What happened, per alert kind, as a title says it.
_HEADLINES = {
    "queued": "queued too long",
    "hang": "hang detected",
    "slowdown": "slowdown detected",
    "restarted": "restart scheduled",
    "rescheduled": "reschedule requested",
    "requeued": "requeued after preemption",
}
#: What to do next, per alert kind, the kind that asks the most first: where to look on
#: the task's page (the card's button) and the same from a terminal. (`abnormal`
#: carries the platform's own next steps in its reason; a success or a stop asks for
#: nothing.)
_NEXT_STEPS = {
    "failed": "read the first error and the workers' last lines on the task's page"
    " (runyard logs {task} --first-error), fix the cause, then Rerun it (runyard rerun {task})",
    "hang": "see where each worker was stuck in the stack report on the task's page"
    " (runyard stacks {task})",
    "slowdown": "compare the workers' step times in the fault-tolerance log on the task's page"
    " (runyard ft-log {task})",
    "queued": "see its place in the queue and why it waits on the task's page"
    " (runyard show {task}); what the pool has free: runyard capacity {pool}",
    "restarted": "nothing unless it keeps restarting: the fault-tolerance log on the task's"
    " page says why (runyard ft-log {task})",
    "rescheduled": "nothing: it is placed again away from the faulty nodes; the"
    " fault-tolerance log says why (runyard ft-log {task})",
    "requeued": "nothing: it waits for capacity again; its place is on the task's page"
    " (runyard show {task})",
}
#: Header colour per alert kind (Feishu card templates).
_COLOURS = {
    "failed": "red",
    "abnormal": "red",
    "hang": "orange",
    "slowdown": "orange",
    "queued": "yellow",
    "restarted": "wathet",
    "rescheduled": "wathet",
    "requeued": "wathet",
    "succeeded": "green",
    "stopped": "grey",
}


@dataclass(frozen=True, slots=True)
class AlertFacts:
    """What one alert says about one task; the card and the text are drawn from it."""

    task_id: str
    task_name: str
    kind: str
    """The alert kind (`failed`, `hang`, `queued`, ...)."""
    state: str
    """The task's status when the alert was raised."""
    pool: str
    spec: str
    """Worker spec and count, e.g. `2 x 8gpu`."""
    run: int
    reason: str
    link: str
    first_error: FirstErrorFact | None = None
    """The run's first error, when the log service knows it (filled in at delivery)."""
    tenant: str = ""
    """The task's tenant (team): a bot may be read by people of several ("": an
    alert raised before the cards named it)."""
    raised_at: str = ""
    """When the alert was raised (ISO 8601, filled in at delivery from its outbox row):
    a card that waited out an outage of Feishu says when it happened."""

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> AlertFacts:
        """Facts as `dataclasses.asdict` wrote them (the outbox and queue-wait rows)."""
        first = data.get("first_error")
        if isinstance(first, dict):
            data = {**data, "first_error": FirstErrorFact(**first)}
        elif first is not None:  # not a shape this version wrote: leave it out
            data = {**data, "first_error": None}
        return cls(**data)


@dataclass(frozen=True, slots=True)
class FirstErrorFact:
    """The first error of a run (R-42), as the log service finds and classifies it."""

    line: str
    """The earliest error line across the run's workers (already cut to `MAX_LINE_CHARS`)."""
    worker: int
    attempt: int
    layer: str
    """The likely layer: `platform`, `image`, `training_code`, `launch_command` or `unknown`."""
    rule: str
    """The first-error rule that matched (e.g. `training.data`; `none` when none did)."""
    why: str = ""
    """What the rule means, as a person reads it."""
    exception: str | None = None
    """For a Python traceback (whose first line names nothing), the line naming the exception."""


def sign(timestamp: int, secret: str) -> str:
    """Feishu's signature: HMAC-SHA256 keyed by `timestamp\\nsecret` over b"", base64."""
    key = f"{timestamp}\n{secret}".encode()
    return base64.b64encode(hmac.new(key, b"", hashlib.sha256).digest()).decode()


def encode(message: dict[str, Any], *, secret: str | None, timestamp: int) -> bytes:
    """The request body: the message, signed when there is a secret."""
    body = dict(message)
    if secret:
        body["timestamp"] = str(timestamp)
        body["sign"] = sign(timestamp, secret)
    return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()


def body_size(message: dict[str, Any]) -> int:
    """Bytes of `message` as sent, with room for the signature fields."""
    signed = encode(message, secret="x", timestamp=0)
    return len(signed) + 20  # a real timestamp is longer than "0"


def title(alert: AlertFacts) -> str:
    """A card's title: the task's name and state, and what happened when the state
    alone does not say it (`train · running · hang detected`)."""
    return f"{_cut(alert.task_name, 100)} · {_headline(alert)}"


def _headline(alert: AlertFacts) -> str:
    what = _HEADLINES.get(alert.kind, alert.kind)
    return alert.state if what == alert.state else f"{alert.state} · {what}"


# --- one task ------------------------------------------------------------------


def task_card(alerts: Sequence[AlertFacts], *, limit: int = MAX_BODY_BYTES) -> dict[str, Any]:
    """One interactive card for one task's alerts (grouped within a window), within `limit`.

    The newest alert gives the title (task name and state) and the key facts;
    earlier ones are listed. Long texts are cut, never the card's structure:
    the result is always a valid card, or the text fallback when even the
    bare card cannot fit.
    """
    latest = alerts[-1]
    budget = MAX_FACT_CHARS
    while budget >= 40:
        card = _task_card(alerts, latest, budget)
        if body_size(card) <= limit:
            return card
        budget //= 2
    return task_text(alerts, limit=limit)


def _task_card(alerts: Sequence[AlertFacts], latest: AlertFacts, budget: int) -> dict[str, Any]:
    fields = [
        _field("Task", latest.task_id),
        *([_field("Tenant", latest.tenant)] if latest.tenant else []),
        _field("Pool", latest.pool),
        _field("Spec", latest.spec),
        _field("Run", str(latest.run)),
        _field("State", latest.state),
        *([_field("Raised", when)] if (when := raised(latest)) else []),
    ]
    elements: list[dict[str, Any]] = [
        {"tag": "div", "fields": fields},
        _markdown(f"**Reason**\n{_md(_cut(latest.reason, budget))}"),
    ]
    if (first := _first_error(alerts)) is not None:
        elements += _first_error_elements(first, budget)
    if (step := next_step(alerts)) is not None:
        elements.append(_markdown(f"**Next step**\n{_md(step)}"))
    if len(alerts) > 1:
        earlier = "\n".join(
            f"- {_md(a.kind)}: {_md(_cut(a.reason, budget // 4))}" for a in alerts[:-1]
        )
        elements.append(_markdown(f"**Also in this window**\n{earlier}"))
    elements.append(_button("Open task", latest.link))
    return _card(title(latest), _COLOURS.get(latest.kind, "blue"), elements)


def task_text(alerts: Sequence[AlertFacts], *, limit: int = MAX_BODY_BYTES) -> dict[str, Any]:
    """The plain-text fallback for one task's alerts, within `limit`."""
    latest = alerts[-1]
    budget = MAX_FACT_CHARS
    while True:
        lines = [
            f"[Runyard] {title(latest)}",
            f"task {latest.task_id}" + (f" · tenant {latest.tenant}" if latest.tenant else ""),
            f"pool {latest.pool} · spec {latest.spec} · run {latest.run}"
            + (f" · raised {when}" if (when := raised(latest)) else ""),
            f"reason: {_cut(latest.reason, budget)}",
        ]
        if (first := _first_error(alerts)) is not None:
            lines += _first_error_lines(first, budget)
        if (step := next_step(alerts)) is not None:
            lines.append(f"next step: {step}")
        lines += [f"also: {a.kind}: {_cut(a.reason, budget // 4)}" for a in alerts[:-1]]
        lines.append(latest.link)
        message = {"msg_type": "text", "content": {"text": _inert("\n".join(lines))}}
        if body_size(message) <= limit or budget < 10:
            return message
        budget //= 2


def raised(alert: AlertFacts) -> str:
    """When `alert` was raised, as a person reads it (`2026-12-06 04:32 UTC`; "" unknown)."""
    try:
        at = datetime.fromisoformat(alert.raised_at)
    except ValueError:
        return ""
    if at.tzinfo is not None:
        at = at.astimezone(UTC)
    return at.strftime("%Y-%m-%d %H:%M UTC")


def next_step(alerts: Sequence[AlertFacts]) -> str | None:
    """What the reader of a task's alerts does next (None: nothing to do): that of the
    kind among them that asks the most (a hang's stack report before the restart it
    caused), as `_NEXT_STEPS` orders them."""
    kinds = {a.kind: a for a in alerts}
    for kind, step in _NEXT_STEPS.items():
        if kind in kinds:
            return step.format(task=kinds[kind].task_id, pool=kinds[kind].pool)
    return None


def _first_error(alerts: Sequence[AlertFacts]) -> FirstErrorFact | None:
    """The first error of the newest alert that has one (a window's `stopped` after a
    `failed` still shows why the run failed)."""
    return next((a.first_error for a in reversed(alerts) if a.first_error), None)


def _error_text(first: FirstErrorFact, budget: int, joiner: str) -> str:
    chars = min(budget, MAX_LINE_CHARS)
    text = _cut(first.line, chars)
    if first.exception:
        text += f"{joiner}{_ELLIPSIS}{joiner}{_cut(first.exception, chars)}"
    return text


def _layer_words(first: FirstErrorFact) -> str:
    return f"{_cut(first.layer, 40)} (rule {_cut(first.rule, 60)})"


def _first_error_elements(first: FirstErrorFact, budget: int) -> list[dict[str, Any]]:
    """The card's "First error" block: where, the line (plain text: a log line is not
    Markdown), and the likely layer with its rule."""
    layer = f"**Likely layer** {_md(_layer_words(first))}"
    if first.why:
        layer += f"\n{_md(_cut(first.why, max(budget // 4, 40)))}"
    return [
        _markdown(f"**First error** · worker {first.worker} · attempt {first.attempt}"),
        _plain(_error_text(first, budget, "\n")),
        _markdown(layer),
    ]


def _first_error_lines(first: FirstErrorFact, budget: int) -> list[str]:
    where = f"worker {first.worker}, attempt {first.attempt}"
    return [
        f"first error ({where}): {_error_text(first, budget, ' ')}",
        f"likely layer: {_layer_words(first)}",
    ]


# --- bursts across tasks -------------------------------------------------------


def summary_cards(
    alerts: Sequence[AlertFacts], *, per_card: int = 40, limit: int = MAX_BODY_BYTES
) -> list[tuple[dict[str, Any], list[AlertFacts]]]:
    """Cards that name every alert of a burst (one line each), each card within `limit`,
    with the alerts each card names.

    A burst is cut into cards of at most `per_card` lines, and a card that
    would still be too large is split again, so no alert is left out.
    """
    chunks = [list(alerts[i : i + per_card]) for i in range(0, len(alerts), per_card)]
    cards: list[tuple[dict[str, Any], list[AlertFacts]]] = []
    while chunks:
        chunk = chunks.pop(0)
        card = _summary_card(chunk, len(alerts))
        if body_size(card) <= limit:
            cards.append((card, chunk))
        elif len(chunk) == 1:
            cards.append((task_card(chunk, limit=limit), chunk))
        else:
            half = len(chunk) // 2
            chunks[:0] = [chunk[:half], chunk[half:]]
    return cards


def _summary_card(chunk: Sequence[AlertFacts], total: int) -> dict[str, Any]:
    kinds: dict[str, int] = {}
    for alert in chunk:
        kinds[alert.kind] = kinds.get(alert.kind, 0) + 1
    counts = ", ".join(f"{n} {kind}" for kind, n in sorted(kinds.items()))
    pools = sorted({a.pool for a in chunk})
    tenants = sorted({a.tenant for a in chunk if a.tenant})
    lines = [
        f"- [{_md(_cut(a.task_name, 80))}]({a.link}) · {_md(_headline(a))} · run {a.run}"
        + (f" · {when}" if (when := raised(a)) else "")
        + f" · {_md(_cut(a.reason, 160))}"
        for a in chunk
    ]
    title = f"{len(chunk)} tasks alerted ({counts})"
    if total > len(chunk):
        title += f" · part of a burst of {total}"
    elements = [
        {
            "tag": "div",
            "fields": [
                *([_field("Tenants", ", ".join(tenants))] if tenants else []),
                _field("Pools", ", ".join(pools)),
                _field("Tasks", str(total)),
            ],
        },
        _markdown("\n".join(lines)),
    ]
    worst = "red" if any(a.kind in ("failed", "abnormal") for a in chunk) else "orange"
    return _card(title, worst, elements)


# --- answers -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Outcome:
    """What Feishu's answer means for one attempt."""

    delivered: bool
    retryable: bool
    reason: str
    code: int | None


def outcome(status: int, body: bytes) -> Outcome:
    """Classify an HTTP answer: accepted, worth retrying (5xx, 11232), or refused for good.

    The reason is fixed text chosen by the code (`feishu 19021: signature or
    timestamp rejected`, `HTTP 404`): nothing the remote end wrote is kept, so
    an answer cannot put its own text into a task's events. A redirect is not
    followed and not a delivery."""
    try:
        data = json.loads(body) if body else {}
    except ValueError:
        data = {}
    if not isinstance(data, dict):
        data = {}
    code = data.get("code", data.get("StatusCode"))
    if 300 <= status < 400:
        return Outcome(False, False, f"HTTP {status}: {REDIRECT_REFUSED}", status)
    if isinstance(code, int) and not isinstance(code, bool):
        if code == 0 and status < 400:
            return Outcome(True, False, "success", 0)
        if code != 0:
            reason = f"feishu {code}: {FEISHU_REASONS.get(code, 'refused by the bot')}"
            return Outcome(False, code in _RETRYABLE_CODES or status >= 500, reason, code)
    if status >= 500 or status == 429:
        return Outcome(False, True, f"HTTP {status}", status)
    if status < 400:
        return Outcome(True, False, f"HTTP {status}", None)
    return Outcome(False, False, f"HTTP {status}", status)


def mask_url(url: str) -> str:
    """The webhook URL with all but the last 4 characters of its hook token hidden."""
    head, _, token = url.rstrip("/").rpartition("/")
    return f"{head}/****{token[-4:]}" if head else "****"


# --- card parts ----------------------------------------------------------------


def _card(title: str, colour: str, elements: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "msg_type": "interactive",
        "card": {
            "config": {"wide_screen_mode": True},
            "header": {"title": {"tag": "plain_text", "content": title}, "template": colour},
            "elements": elements,
        },
    }


def _field(name: str, value: str) -> dict[str, Any]:
    return {"is_short": True, "text": {"tag": "lark_md", "content": f"**{name}**\n{_md(value)}"}}


def _markdown(content: str) -> dict[str, Any]:
    return {"tag": "div", "text": {"tag": "lark_md", "content": content}}


def _plain(content: str) -> dict[str, Any]:
    return {"tag": "div", "text": {"tag": "plain_text", "content": content}}


def _button(label: str, url: str) -> dict[str, Any]:
    return {
        "tag": "action",
        "actions": [
            {
                "tag": "button",
                "text": {"tag": "plain_text", "content": label},
                "url": url,
                "type": "primary",
            }
        ],
    }


#: What Feishu's Markdown (`lark_md`) reads as markup: tags (`<at id=all></at>` mentions
#: everyone, `<a href>`, `<font>`), links, emphasis and code. Text a person or a worker
#: wrote (a task's name, a reason, a log line) is written with Feishu's numeric
#: entities instead, so it shows as typed and can neither mention nor link (`&` too,
#: so an entity typed in a name stays text).
_MARKDOWN_ENTITIES = str.maketrans({c: f"&#{ord(c)};" for c in "&<>[]*~`"})
#: A text message reads `<at user_id="all"></at>` as a mention: its tags are made inert.
_TEXT_ENTITIES = str.maketrans({c: f"&#{ord(c)};" for c in "&<>"})


def _md(text: str) -> str:
    """`text` as plain words inside `lark_md` content (no markup of its own)."""
    return text.translate(_MARKDOWN_ENTITIES)


def _inert(text: str) -> str:
    """A text message's content with no tag Feishu would act on (a mention)."""
    return text.translate(_TEXT_ENTITIES)


def _cut(text: str, chars: int) -> str:
    return text if len(text) <= chars else text[: max(chars - 1, 0)] + _ELLIPSIS
