"""The web console's pure parts: sessions (expiry, CSRF) and how values are shown."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from runyard.api.errors import BadRequest
from runyard.gateway.console import clone, display, sre_replay
from runyard.gateway.console.sessions import MemorySessions, csrf_of, seal, session_key, unseal

T0 = datetime(2026, 1, 1, tzinfo=UTC)


async def test_a_session_is_opaque_and_ends_at_its_expiry_or_sign_out() -> None:
    now = [T0]  # the test moves the clock by hand
    sessions = MemorySessions(lambda: now[0], ttl=timedelta(hours=1))
    session = await sessions.open("secret-token")
    assert "secret-token" not in session.session_id and len(session.session_id) >= 40
    assert await sessions.get(session.session_id) == session
    assert await sessions.get("forged") is None and await sessions.get(None) is None
    now[0] = T0 + timedelta(hours=1)
    assert await sessions.get(session.session_id) is None
    again = await sessions.open("secret-token")
    assert again.session_id != session.session_id and again.csrf != session.csrf
    await sessions.close(again.session_id)
    assert await sessions.get(again.session_id) is None


async def test_csrf_token_must_be_the_sessions_own() -> None:
    session = await MemorySessions().open("t")
    assert session.csrf_matches(session.csrf)
    assert not session.csrf_matches(None)
    assert not session.csrf_matches("")
    assert not session.csrf_matches((await MemorySessions().open("t")).csrf)


def test_a_stored_session_is_of_no_use_without_its_id() -> None:
    sealed = seal("the-session-id", "secret-token")
    assert b"secret-token" not in sealed
    assert unseal("the-session-id", sealed) == "secret-token"
    assert unseal("another-id", sealed) is None
    assert unseal("the-session-id", sealed[:-1] + bytes([sealed[-1] ^ 1])) is None
    assert unseal("the-session-id", b"short") is None
    assert "the-session-id" not in session_key("the-session-id")
    assert csrf_of("the-session-id") != csrf_of("another-id")


def test_durations_and_ages_in_words() -> None:
    assert display.duration(None) == "—"
    assert display.duration(1234) == "1.2 s"
    assert display.duration(184_000) == "3 m 04 s"
    assert display.duration(7_500_000) == "2 h 05 m"
    assert display.age((T0 - timedelta(seconds=42)).isoformat(), T0) == "42 s"
    assert display.age((T0 - timedelta(days=3, hours=2)).isoformat(), T0) == "3 d"


def _stage(name: str, start_s: float, end_s: float | None, run: int = 1) -> dict[str, object]:
    at = T0 + timedelta(seconds=start_s)
    end = None if end_s is None else (T0 + timedelta(seconds=end_s)).isoformat()
    took = None if end_s is None else int((end_s - start_s) * 1000)
    return {
        "run": run,
        "attempt": 1,
        "stage": name,
        "started_at": at.isoformat(),
        "finished_at": end,
        "duration_ms": took,
        "result": "running" if end_s is None else "completed",
    }


def test_stage_chart_draws_the_last_attempt_on_one_axis() -> None:
    stages = [
        _stage("resource_allocation", 0, 50, run=1),
        _stage("resource_allocation", 100, 101, run=2),
        _stage("image_pull", 101, 109, run=2),
        _stage("storage_mount", 109, None, run=2),
    ]
    bars = display.stage_chart(stages, now=T0 + timedelta(seconds=111))
    assert [b.label for b in bars] == ["resource_allocation", "image_pull", "storage_mount"]
    first, pull, mount = bars
    assert first.x == display.CHART_LABEL_W
    assert pull.width > first.width and pull.width > mount.width  # where the time went
    assert mount.x + mount.width == pytest.approx(display.CHART_LABEL_W + display.CHART_BARS_W)
    assert (pull.took, mount.took) == ("8.0 s", "2.0 s")
    assert display.stage_chart([], T0) == []


def test_log_lines_are_escaped_and_matches_marked() -> None:
    words = display.search_pattern("words", "loss NaN")
    line = "<b>Loss</b> is nan"
    assert str(display.marked(line, words)) == (
        "&lt;b&gt;<mark>Loss</mark>&lt;/b&gt; is <mark>nan</mark>"
    )
    phrase = display.search_pattern("phrase", "a.b")
    assert str(display.marked("a.b axb", phrase)) == "<mark>a.b</mark> axb"
    regex = display.search_pattern("regex", "ep(och)? [0-9]+", ignore_case=True)
    assert str(display.marked("EPOCH 12 done", regex)) == "<mark>EPOCH 12</mark> done"
    assert display.search_pattern("regex", "(unclosed") is None
    assert str(display.marked("<i>", None)) == "&lt;i&gt;"


def _run_stage(run: int, attempt: int, start: str, end: str | None) -> dict[str, object]:
    return {"run": run, "attempt": attempt, "started_at": start, "finished_at": end}


def test_runs_newest_first_with_attempts_times_and_the_rerun_changes() -> None:
    stages = [
        _run_stage(1, 1, "2026-01-01T00:00:00+00:00", "2026-01-01T00:01:00+00:00"),
        _run_stage(1, 2, "2026-01-01T00:02:00+00:00", "2026-01-01T00:03:00+00:00"),
        _run_stage(2, 1, "2026-01-01T01:00:00+00:00", None),
    ]
    reruns = [{"data": {"run": 2, "changes": ["command"], "spec": {"command": "echo again"}}}]
    rows = display.runs(stages, reruns, current=3, status="queued")
    assert [r["run"] for r in rows] == [3, 2, 1]
    assert rows[0] == {
        "run": 3,
        "attempts": 0,
        "started_at": None,
        "ended_at": None,
        "changes": {},
        "status": "queued",
    }
    assert rows[1]["changes"] == {"command": "echo again"} and rows[1]["ended_at"] is None
    assert rows[2]["attempts"] == 2 and rows[2]["ended_at"] == "2026-01-01T00:03:00+00:00"
    assert rows[2]["status"] == "ended"


def test_a_clone_form_leaves_creator_only_values_out() -> None:
    env = [
        {"name": "PLAIN", "value": "1", "creator_only": False},
        {"name": "TOKEN", "value": "hunter2", "creator_only": True},
    ]
    assert display.env_text(env) == ("PLAIN=1", ["TOKEN"])


def test_a_node_of_the_grid_names_only_readable_tasks() -> None:
    node = {"node": "n-0", "health": "healthy", "gpus": 3, "free": 1, "owners": ["a", "b", None]}
    cell = display.node_cell(node, lambda task: task == "a")
    assert [(g["used"], g["task_id"]) for g in cell["gpus"]] == [
        (True, "a"),
        (True, None),
        (False, None),
    ]
    assert cell["free"] == 1 and cell["total"] == 3


def test_rerun_changes_are_the_fields_changed_only() -> None:
    from runyard.gateway.console.task_pages import rerun_changes

    spec = {"command": "echo a", "image": "bash-only", "worker_spec": "1gpu", "worker_count": 1}
    form = {"command": "echo b", "image": "bash-only", "worker_spec": "1gpu", "worker_count": "2"}
    assert rerun_changes(spec, form) == {"command": "echo b", "worker_count": 2}
    assert rerun_changes(spec, {"command": "echo a", "worker_count": "1"}) == {}


def test_consumer_lag_is_read_from_the_metrics_text() -> None:
    from runyard.gateway.console.sre import consumer_lags

    text = (
        "# TYPE runyard_consumer_lag gauge\n"
        'runyard_consumer_lag{consumer="scheduler",topic="t.tasks"} 3.0\n'
        'runyard_other{consumer="x"} 1\n'
    )
    assert consumer_lags(text) == [{"consumer": "scheduler", "topic": "t.tasks", "lag": 3.0}]


def test_stack_reports_and_alerts_render_escaped() -> None:
    from runyard.gateway.console.pages import template

    functions = {"allreduce": {"threads": 2, "workers": [0, 1]}}
    frames = {"0": ["allreduce (dist.py:10)"]}
    report = {
        "report_id": "r1",
        "task_id": "t1",
        "run": 1,
        "attempt": 2,
        "captured_at": "2026-01-01T00:00:00+00:00",
        "summary": "<b>2 of 3 workers</b> wait in allreduce",
        "odd_ones_out": [2],
        "frames_by_worker": frames,
        "functions": functions,
    }
    html = template(
        "stack_report.html",
        task={"task_id": "t1", "name": "train"},
        report=report,
        functions=list(functions.items()),
        frames=list(frames.items()),
    )
    assert "&lt;b&gt;2 of 3 workers" in html and "allreduce (dist.py:10)" in html
    assert (
        'captured <time datetime="2026-01-01T00:00:00+00:00" title="2026-01-01T00:00:00+00:00">'
        "2026-01-01 00:00:00 UTC</time>" in html
    )
    alerts = [
        {
            "type": "AlertDelivered",
            "at": "t",
            "data": {"alert": "failed", "channel": "feishu:1", "attempt": 1},
        },
        {
            "type": "AlertFailed",
            "at": "t",
            "data": {
                "alert": "hang",
                "channel": "feishu:2",
                "reason": "timed out",
                "code": 504,
                "retryable": True,
            },
        },
    ]
    html = template("task_alerts.html", alerts=alerts, page=50)
    assert "delivered (attempt 1)" in html and "failed: timed out (504), retried" in html


def test_server_sent_rows_are_one_data_line_per_html_line_and_ignore_age() -> None:
    from runyard.gateway.console import live

    assert live._event("rows", "<tr>\n<td>a</td></tr>") == (
        "event: rows\ndata: <tr>\ndata: <td>a</td></tr>\n\n"
    )
    assert live._event("end", "") == "event: end\ndata: \n\n"
    row = {"task_id": "t", "status": "running", "age": "3 s"}
    assert live._key(row) == live._key({**row, "age": "4 s"})
    assert live._key(row) != live._key({**row, "status": "succeeded"})


def test_a_clone_keeps_every_field_but_creator_only_variables() -> None:
    spec = {
        "name": "train",
        "custom_gpus": None,
        "env": [
            {"name": "KEY", "value": "s3cr3t", "creator_only": True},
            {"name": "PLAIN", "value": "1", "creator_only": False},
        ],
        "mounts": [{"file_system": "fs-main", "volume": "datasets", "mount_path": "/data"}],
        "fault_tolerance": {"auto_restart": True, "max_restarts": 2},
    }
    copied, hidden = clone.clone_spec(spec)
    assert hidden == ["KEY"]
    assert "custom_gpus" not in copied and copied["mounts"] == spec["mounts"]
    text = clone.spec_text(copied)
    assert "s3cr3t" not in text and "max_restarts: 2" in text
    assert clone.parse_spec(text) == copied
    for bad in ("name: [", "- just a list"):
        with pytest.raises(BadRequest) as refused:
            clone.parse_spec(bad)
        assert refused.value.code == "console.spec_yaml"
    # Typed into the textarea as into a task file: YAML 1.1's yes/no/on/off and 010
    # are text (an env value, a tag), as the CLI reads them.
    typed = "name: off\ntags: [on, 'x']\nenv:\n- {name: DEBUG, value: no}\n- {name: N, value: 010}"
    assert clone.parse_spec(typed) == {
        "name": "off",
        "tags": ["on", "x"],
        "env": [{"name": "DEBUG", "value": "no"}, {"name": "N", "value": "010"}],
    }


def test_whatif_form_becomes_the_apis_body() -> None:
    body = sre_replay.whatif_body(
        {"pool": "dev-a100", "from": "2h", "to": "2026-12-01T10:00:00Z", "nodes": "8", "gpus": "4"}
    )
    assert body["to"] == "2026-12-01T10:00:00Z" and body["policy"] == "backfill"
    assert datetime.fromisoformat(body["from"]).tzinfo is not None
    assert body["pools"] == [
        {"id": "dev-a100", "nodes": {"prefix": "dev-a100-whatif-", "count": 8, "gpus": 4}}
    ]
    document = "pools:\n  - {id: p, nodes: {prefix: n-, count: 2, gpus: 8}}\n"
    with_document = sre_replay.whatif_body(
        {"from": "30m", "to": "0m", "policy": "fifo", "pools_yaml": document}
    )
    assert with_document["pools"][0]["id"] == "p" and with_document["policy"] == "fifo"
    assert "pool" not in with_document
    for form, code in (
        ({"from": "1h", "to": "0m", "nodes": "8"}, "console.whatif_nodes"),
        ({"from": "", "to": "0m"}, "console.whatif_window"),
        ({"from": "999999d", "to": "0m"}, "console.whatif_window"),  # before year 1: was a 500
        ({"from": "1h", "to": "0m", "pools_yaml": "[oops"}, "console.whatif_pools"),
    ):
        with pytest.raises(BadRequest) as refused:
            sre_replay.whatif_body(form)
        assert refused.value.code == code


def test_the_log_pages_times_are_read_as_utc() -> None:
    from runyard.gateway.console.pages import utc_time

    assert utc_time("2026-12-01T10:00") == "2026-12-01T10:00:00Z"
    assert utc_time("2026-12-01T10:00:05") == "2026-12-01T10:00:05Z"
    assert utc_time("2026-12-01T10:00:05+08:00") == "2026-12-01T10:00:05+08:00"
    assert utc_time("yesterday") == "yesterday"  # the log API refuses it, with its hint


def test_the_log_page_filters_by_run_and_attempt_and_keeps_them_in_its_links() -> None:
    from runyard.gateway.console.pages import _log_search_of

    search = _log_search_of({"worker": "1", "run": "2", "attempt": " 3 ", "q": "loss"})
    assert search["api"] == {"worker": "1", "run": "2", "attempt": "3", "words": "loss"}
    assert search["params"]["run"] == "2" and search["params"]["attempt"] == " 3 "
    unfiltered = _log_search_of({})
    assert unfiltered["api"] == {} and "attempt" not in unfiltered["params"]


def test_times_are_shown_to_the_second_in_utc_with_the_exact_value_kept() -> None:
    exact = "2026-12-06T04:32:40.582299+00:00"
    shown = str(display.when(exact))
    assert shown == f'<time datetime="{exact}" title="{exact}">2026-12-06 04:32:40 UTC</time>'
    assert "2026-12-06 12:32:40" not in str(display.when("2026-12-06T12:32:40+08:00"))
    assert ">2026-12-06 04:32:40 UTC<" in str(display.when("2026-12-06T12:32:40.5+08:00"))
    assert ">2026-12-06 04:32:40 UTC<" in str(display.when("2026-12-06T04:32:40Z"))
    moment = datetime(2026, 12, 6, 4, 32, 40, 582299, tzinfo=UTC)
    assert ">2026-12-06 04:32:40 UTC<" in str(display.when(moment))
    assert display.when(None) == display.when("") == "—"
    assert str(display.when('<b>"soon"</b>')) == '<b>"soon"</b>'  # escaped by the page
