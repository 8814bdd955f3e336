"""The Feishu adapter (bodies, signing, fitting in 20 KB, answers), the token buckets,
and the fake Feishu server the notification tests rely on."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from dataclasses import asdict, replace
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
from runyard.contracts.spec import TaskSpec
from runyard.contracts.task_events import TaskFailed
from runyard.domain import Submit, decide, fold
from runyard.logs import FirstError, LogLine, classify, traceback_exception
from runyard.notification import feishu, firsterror, rules
from runyard.notification.feishu import AlertFacts, FirstErrorFact
from runyard.notification.ratelimit import Limits

from tests.feishu_fake import FeishuFake, _valid_message


def facts(i: int = 0, reason: str = "worker 0 exited with status 1", **kw: Any) -> AlertFacts:
    base = AlertFacts(
        task_id=f"t-{i}",
        task_name=f"train-{i}",
        kind="failed",
        state="failed",
        pool="pool-a",
        spec="2 x 8gpu",
        run=1,
        reason=reason,
        link=f"http://gw/v1/tasks/t-{i}",
    )
    return replace(base, **kw)


@pytest.fixture
async def fake() -> AsyncIterator[FeishuFake]:
    server = FeishuFake(bots={"signed": "k3y", "plain": None})
    await server.start()
    yield server
    await server.stop()


async def post(fake: FeishuFake, token: str, body: bytes) -> feishu.Outcome:
    async with httpx.AsyncClient() as client:
        answer = await client.post(fake.url(token), content=body)
    return feishu.outcome(answer.status_code, answer.content)


# --- signing and the fake's checks ----------------------------------------------------------


async def test_a_signed_card_is_accepted_and_a_bad_or_stale_signature_is_19021(
    fake: FeishuFake,
) -> None:
    card = feishu.task_card([facts()])
    now = int(time.time())
    assert (await post(fake, "signed", feishu.encode(card, secret="k3y", timestamp=now))).delivered
    wrong = await post(fake, "signed", feishu.encode(card, secret="nope", timestamp=now))
    stale = await post(fake, "signed", feishu.encode(card, secret="k3y", timestamp=now - 7200))
    for refused in (wrong, stale):
        assert (refused.code, refused.retryable) == (19021, False)
        assert "sign match fail" in refused.reason


async def test_the_fake_rate_limits_with_11232_and_refuses_big_bodies_with_9499(
    fake: FeishuFake,
) -> None:
    # A wide "second" keeps all six posts in one window however slow the machine is.
    fake.second_s = 60.0
    body = feishu.encode(feishu.task_text([facts()]), secret=None, timestamp=0)
    answers = [await post(fake, "plain", body) for _ in range(6)]
    assert [a.delivered for a in answers] == [True] * 5 + [False]
    assert (answers[-1].code, answers[-1].retryable) == (11232, True)
    big = {"msg_type": "text", "content": {"text": "x" * 21_000}}
    refused = await post(fake, "signed", feishu.encode(big, secret=None, timestamp=0))
    assert (refused.code, refused.retryable) == (9499, False)


def test_signature_is_hmac_of_an_empty_message_keyed_by_timestamp_and_secret() -> None:
    # Computed independently: hmac.new(b"1700000000\nk3y", b"", sha256), base64.
    assert feishu.sign(1700000000, "k3y") == "gdHVLqUhUrOgMHdlmjGXCaUZsAyUD1VU0qw4ZD/YdpQ="
    body = json.loads(feishu.encode({"msg_type": "text"}, secret="k3y", timestamp=1700000000))
    assert body["timestamp"] == "1700000000" and body["sign"] == feishu.sign(1700000000, "k3y")
    assert "timestamp" not in json.loads(feishu.encode({"a": 1}, secret=None, timestamp=1))


# --- bodies within 20 KB ------------------------------------------------------------------------


def test_a_huge_reason_is_cut_and_the_card_stays_valid_and_small() -> None:
    huge = facts(reason="Traceback (most recent call last):\n" + "  frame ✗\n" * 10_000)
    card = feishu.task_card([huge, huge, huge], limit=feishu.MAX_BODY_BYTES)
    raw = feishu.encode(card, secret="k3y", timestamp=int(time.time()))
    assert len(raw) <= feishu.MAX_BODY_BYTES
    assert card["msg_type"] == "interactive" and _valid_message(json.loads(raw))
    assert "…" in raw.decode()
    text = feishu.task_text([huge])
    assert len(feishu.encode(text, secret=None, timestamp=0)) <= feishu.MAX_BODY_BYTES


def test_a_card_that_cannot_fit_falls_back_to_valid_text() -> None:
    message = feishu.task_card([facts(task_name="n" * 5000)], limit=900)
    assert message["msg_type"] == "text" and _valid_message(message)


def test_summary_cards_name_every_task_and_each_fits() -> None:
    burst = [facts(i, reason="lost capacity " + "z" * 900) for i in range(100)]
    cards = feishu.summary_cards(burst, per_card=40, limit=feishu.MAX_BODY_BYTES)
    assert sorted(f.task_id for _, named in cards for f in named) == sorted(
        f.task_id for f in burst
    )
    for card, named in cards:
        assert feishu.body_size(card) <= feishu.MAX_BODY_BYTES and _valid_message(card)
        assert all(f.task_name in json.dumps(card) for f in named)


MARKUP = (
    "<at id=all></at> [runbook](https://evil.example/x) **urgent** ~~x~~ `c` &#60;at id=all&#62;"
)
TEXT_MENTION = '<at user_id="all">everyone</at>'


def _lark_md(message: dict[str, Any]) -> list[str]:
    """Every `lark_md` content of a card (fields and text blocks)."""
    found: list[str] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if node.get("tag") == "lark_md":
                found.append(str(node["content"]))
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(message)
    return found


def test_a_tasks_name_reason_and_log_line_cannot_mention_everyone_or_link() -> None:
    """Text a person or a worker wrote is Feishu's numeric entities in `lark_md`: no
    `<at id=all>` mention, no forged link, no emphasis; in a text message no mention."""
    error = replace(TRACEBACK_ERROR, why=MARKUP, layer="<at id=all></at>")
    named = facts(task_name=TEXT_MENTION + MARKUP, reason=MARKUP, pool="p<at id=all></at>")
    burst = [named, *(facts(i) for i in range(1, 5))]
    messages = [
        feishu.task_card([replace(named, kind="hang"), replace(named, first_error=error)]),
        *(card for card, _ in feishu.summary_cards(burst)),
    ]
    for message in messages:
        contents = _lark_md(message)
        assert contents and _valid_message(message)
        for content in contents:
            assert "<at" not in content and "<a " not in content and "](https://evil" not in content
            assert "**urgent**" not in content
        shown = "\n".join(contents)
        assert "&#60;at id=all&#62;&#60;/at&#62; &#91;runbook&#93;(https://evil.example/x)" in shown
        assert "&#38;#60;at id=all&#38;#62;" in shown  # a typed entity stays text
    # the title is plain text: shown as typed
    assert messages[0]["card"]["header"]["title"]["content"].startswith(TEXT_MENTION)
    text = feishu.task_text([replace(named, first_error=error)])["content"]["text"]
    assert "<at" not in text and '&#60;at user_id="all"&#62;everyone&#60;/at&#62;' in text


def test_a_card_and_its_text_name_the_task_and_its_tenant() -> None:
    """A bot can be read by people of several teams: every card says which task
    (its id, for `runyard show`) and whose (the tenant)."""
    alert = facts(3, kind="stopped", state="stopped", tenant="team-nlp")
    card = json.dumps(feishu.task_card([alert]), ensure_ascii=False)
    assert "**Task**\\nt-3" in card and "**Tenant**\\nteam-nlp" in card
    text = feishu.task_text([alert])["content"]["text"]
    assert "task t-3 · tenant team-nlp" in text
    [(summary, _)] = feishu.summary_cards([facts(i, tenant="team-nlp") for i in range(5)])
    assert "**Tenants**\\nteam-nlp" in json.dumps(summary, ensure_ascii=False)
    older = {k: v for k, v in asdict(facts(4)).items() if k != "tenant"}  # an older outbox row
    assert AlertFacts.from_json(older).tenant == ""
    assert "Tenant" not in json.dumps(feishu.task_card([AlertFacts.from_json(older)]))


def test_a_card_says_when_its_alert_was_raised() -> None:
    """A card that waited out an outage of Feishu arrives late: it says when."""
    alert = facts(5, raised_at="2026-12-06T12:32:40.5+08:00")
    card = json.dumps(feishu.task_card([alert]), ensure_ascii=False)
    assert "**Raised**\\n2026-12-06 04:32 UTC" in card
    assert "raised 2026-12-06 04:32 UTC" in feishu.task_text([alert])["content"]["text"]
    [(summary, _)] = feishu.summary_cards([replace(alert, task_id=f"t-{i}") for i in range(5)])
    assert json.dumps(summary).count("2026-12-06 04:32 UTC") == 5
    assert "Raised" not in json.dumps(feishu.task_card([facts(6)]))  # not known: left out


def test_a_card_says_what_to_do_next_for_its_kind() -> None:
    """Each alert that asks something of its reader says what: where to look on the
    task's page and the same from a terminal; a stop or a success asks nothing."""
    steps = {
        "failed": "runyard logs t-0 --first-error",
        "hang": "runyard stacks t-0",
        "slowdown": "runyard ft-log t-0",
        "queued": "runyard capacity pool-a",
        "restarted": "runyard ft-log t-0",
    }
    for kind, command in steps.items():
        card = feishu.task_card([facts(kind=kind)])
        [step] = [c for c in _lark_md(card) if c.startswith("**Next step**")]
        assert command in step and "task's page" in step, kind
        text = feishu.task_text([facts(kind=kind)])["content"]["text"]
        assert "next step: " in text and command in text, kind
    # a hang and the restart it caused, in one card: the stack report is the next step
    both = [facts(kind="hang"), facts(kind="restarted")]
    [step] = [c for c in _lark_md(feishu.task_card(both)) if c.startswith("**Next step**")]
    assert "runyard stacks t-0" in step
    for kind in ("stopped", "succeeded"):
        assert "Next step" not in json.dumps(feishu.task_card([facts(kind=kind)]))
        assert "next step" not in feishu.task_text([facts(kind=kind)])["content"]["text"]


def test_a_failures_reason_names_its_worker_once() -> None:
    spec = TaskSpec(name="t", pool="p", worker_spec="1gpu", image="i", command="c")
    now = datetime(2026, 1, 1, tzinfo=UTC)
    submitted = decide(None, Submit("t-1", "t1", "alice", spec), now=now, ids=str)
    state = fold([(e, now) for e in submitted], task_id="t-1")

    def failed(why: str, worker: int | None = 0) -> str:
        event = TaskFailed(run=1, attempt=1, reason=why, worker=worker, exit_code=3)
        return rules.reason(event, state)

    assert failed("worker 0 exited with code 3") == "worker 0 exited with code 3"
    assert failed("out of memory") == "out of memory (worker 0 exit 3)"
    assert failed("worker 10 exited with code 3", 1) == (
        "worker 10 exited with code 3 (worker 1 exit 3)"
    )
    assert failed("hang, no restarts left", None) == "hang, no restarts left"


# --- the first error ----------------------------------------------------------------------------

TRACEBACK_ERROR = FirstErrorFact(
    line="Traceback (most recent call last):",
    worker=1,
    attempt=2,
    layer="training_code",
    rule="training.data",
    why="the data pipeline (dataset, collator, DataLoader) failed",
    exception="KeyError: 'input_ids'",
)


def test_the_first_error_is_on_the_card_and_in_the_text_fallback() -> None:
    alert = facts(first_error=TRACEBACK_ERROR)
    card = feishu.task_card([alert])
    elements = card["card"]["elements"]
    at = next(
        i
        for i, e in enumerate(elements)
        if e.get("text", {}).get("content", "").startswith("**First error**")
    )
    heading, line, layer = elements[at : at + 3]
    assert heading["text"]["content"] == "**First error** · worker 1 · attempt 2"
    assert line["text"] == {
        "tag": "plain_text",  # a log line is not Markdown
        "content": "Traceback (most recent call last):\n…\nKeyError: 'input_ids'",
    }
    assert layer["text"]["content"].startswith(
        "**Likely layer** training_code (rule training.data)"
    )
    assert _valid_message(card)
    text = feishu.task_text([alert])["content"]["text"]
    assert "first error (worker 1, attempt 2): Traceback" in text
    assert "likely layer: training_code (rule training.data)" in text
    # A later alert of the window without one (stopped after failed) still shows it.
    later = facts(kind="stopped", state="stopped", reason="stopped")
    assert "KeyError" in json.dumps(feishu.task_card([alert, later]))
    assert "First error" not in json.dumps(feishu.task_card([facts()]))


def test_a_huge_first_error_and_reason_are_cut_and_the_card_stays_valid() -> None:
    line = firsterror.clean("RuntimeError: " + "✗ tensor mismatch " * 20_000)
    assert len(line) == feishu.MAX_LINE_CHARS and line.endswith("…")
    huge = replace(TRACEBACK_ERROR, line=line, exception=line, why="w" * 5000)
    alert = facts(reason="r" * 50_000, first_error=huge)
    for limit in (feishu.MAX_BODY_BYTES, 4000, 2500):
        card = feishu.task_card([alert, alert], limit=limit)
        assert card["msg_type"] == "interactive" and _valid_message(card)
        assert feishu.body_size(card) <= limit
        assert "**First error** · worker 1 · attempt 2" in json.dumps(card, ensure_ascii=False)
        assert "training_code (rule training.data)" in json.dumps(card)
        text = feishu.task_text([alert], limit=limit)
        assert feishu.body_size(text) <= limit and _valid_message(text)
    assert feishu.task_card([alert], limit=900)["msg_type"] == "text"


def test_facts_with_a_first_error_survive_the_outbox_json() -> None:
    alert = facts(first_error=TRACEBACK_ERROR)
    assert AlertFacts.from_json(json.loads(json.dumps(asdict(alert)))) == alert
    assert AlertFacts.from_json(json.loads(json.dumps(asdict(facts())))) == facts()
    older = {k: v for k, v in asdict(facts()).items() if k != "first_error"}
    assert AlertFacts.from_json(older) == facts()


def _found(lines: list[str], worker: int = 0) -> FirstError:
    at = datetime(2026, 1, 1, tzinfo=UTC)
    logged = [
        LogLine(at, i, "t", 1, 1, worker, "stderr", None, text) for i, text in enumerate(lines)
    ]
    end = traceback_exception(lines)  # the log service says which line names the exception
    return FirstError(
        logged[0], [], logged[1:], classify(lines), logged[end] if end is not None else None
    )


def test_the_log_services_answer_as_the_card_says_it() -> None:
    found = _found(
        [
            "\x1b[1;31m[rank0]: Traceback (most recent call last):\x1b[0m",
            '[rank0]:   File "/workspace/train.py", line 120, in <module>',
            "[rank0]:     loss.backward()",
            "[rank0]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.",
            "[rank0]: later noise",
        ],
        worker=3,
    )
    fact = firsterror.fact(found.to_json())  # the log service's answer
    assert fact == FirstErrorFact(
        line="[rank0]: Traceback (most recent call last):",
        worker=3,
        attempt=1,
        layer="training_code",
        rule="training.cuda_oom",
        why=fact.why,
        exception=found.after[2].line,
    )
    assert "torch.OutOfMemoryError: CUDA out of memory" in found.after[2].line
    # A traceback cut short names no exception; any other line needs none.
    cut_short = firsterror.fact(
        _found(["Traceback (most recent call last):", '  File "x.py"']).to_json()
    )
    assert cut_short.exception is None
    plain = firsterror.fact(
        _found(["bash: line 1: cd: /workspace/proj: No such file or directory"]).to_json()
    )
    assert (plain.layer, plain.rule, plain.exception) == (
        "launch_command",
        "launch.working_directory",
        None,
    )
    assert firsterror.clean("a\tb\rc\x00d\x1b[2K  ") == "a\tb c d"


# --- answers -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "body", "delivered", "retryable", "code"),
    [
        (200, b'{"code":0,"msg":"success"}', True, False, 0),
        (200, b'{"StatusCode":0,"StatusMessage":"success"}', True, False, 0),
        (200, b'{"code":11232,"msg":"frequency limited"}', False, True, 11232),
        (200, b'{"code":19021,"msg":"sign match fail"}', False, False, 19021),
        (400, b'{"code":9499,"msg":"Bad Request"}', False, False, 9499),
        (502, b"<html>bad gateway</html>", False, True, 502),
        (404, b"not found", False, False, 404),
    ],
)
def test_answers_are_classified(
    status: int, body: bytes, delivered: bool, retryable: bool, code: int
) -> None:
    outcome = feishu.outcome(status, body)
    assert (outcome.delivered, outcome.retryable, outcome.code) == (delivered, retryable, code)


# --- Feishu's limits -------------------------------------------------------------------


def test_the_limits_keep_at_most_5_a_second_and_100_a_minute() -> None:
    limits = Limits(margin_s=0.0)
    now, sent = 0.0, list[float]()
    while now < 180:
        if limits.wait_s(sent, now) == 0:
            sent.append(now)
        else:
            now = round(now + 0.01, 2)
    for i, at in enumerate(sent):
        assert sum(1 for t in sent[: i + 1] if at - t < 1.0) <= 5
        assert sum(1 for t in sent[: i + 1] if at - t < 60.0) <= 100
    assert len(sent) == 300  # and no slower than the limits allow


def test_the_wait_is_until_the_oldest_request_of_a_full_window_leaves_it() -> None:
    limits = Limits(margin_s=0.0)
    assert limits.wait_s([], 10.0) == 0
    assert limits.wait_s([9.0, 9.2, 9.4, 9.6], 10.0) == 0
    assert limits.wait_s([9.2, 9.4, 9.6, 9.8, 9.9], 10.0) == pytest.approx(0.2)
    minute = [40.5 + 0.59 * i for i in range(100)]  # 100 in the last minute, 2 a second
    assert limits.wait_s(minute, 100.0) == pytest.approx(0.5)
