"""The pure parts of the support bundle: redaction, the archive's secret scan and size
bound, escaping, numbered tails (the whole bundle is in tests/integration/test_bundle.py)."""

from __future__ import annotations

import json
import zipfile
from datetime import UTC, datetime

import pytest
from runyard.gateway.bundle import (
    MAX_LINE_CHARS,
    REDACTED,
    Archive,
    BundleRefused,
    Secrets,
    Tail,
    escape_controls,
    find_secret,
    mask_webhook,
    webhook_credential,
)

NOW = datetime(2026, 12, 1, 6, 0, tzinfo=UTC)


def test_redaction_takes_the_longest_value_first_and_escapes_none() -> None:
    secrets = Secrets(["abc.def+ghi", "abc.def+ghi-and-more", "short"])
    assert secrets.redact("x abc.def+ghi-and-more y abc.def+ghi z") == (
        f"x {REDACTED} y {REDACTED} z"
    )
    assert secrets.redact("abcXdef+ghi") == "abcXdef+ghi"  # `.` is not a wildcard
    assert secrets.redact("short stays") == "short stays"  # under 8 characters: not searched


def test_redacted_json_stays_json() -> None:
    secrets = Secrets(['pa"ss\\word-1'])
    value = {"env": [{"value": 'x pa"ss\\word-1 y'}], 'k pa"ss\\word-1': 3}
    text = json.dumps(secrets.redact_json(value))
    assert json.loads(text) == {"env": [{"value": f"x {REDACTED} y"}], f"k {REDACTED}": 3}
    assert b'pa\\"ss\\\\word-1' in secrets.needles()  # as JSON writes it


def test_the_scan_finds_a_value_split_between_two_chunks() -> None:
    secret = "s3cr3t-value-9"
    archive = Archive(Secrets([secret]), 64 * 1024 * 1024, NOW)
    # the value straddles the scan's 1 MiB chunks
    archive.zip.writestr("big.txt", b"x" * (1024 * 1024 - 5) + secret.encode())
    with pytest.raises(BundleRefused) as refused:
        archive.finish()
    assert refused.value.code == "bundle.secret_found" and "big.txt" in refused.value.message
    archive.discard()


def test_a_member_written_through_the_archive_is_redacted_and_passes() -> None:
    secret = "s3cr3t-value-9"
    archive = Archive(Secrets([secret]), 64 * 1024 * 1024, NOW)
    archive.text("a.txt", f"the value is {secret}\n")
    archive.json("b.json", {"v": secret})
    with archive.open("c.jsonl") as member:
        archive.write_lines(member, [{"line": secret}, {"line": "plain"}])
    size = archive.finish()
    assert size > 0 and find_secret(archive.file, Secrets([secret]).needles()) is None
    archive.file.seek(0)
    with zipfile.ZipFile(archive.file) as done:
        assert done.namelist() == ["a.txt", "b.json", "c.jsonl"]
        assert done.read("a.txt") == f"the value is {REDACTED}\n".encode()
        assert json.loads(done.read("c.jsonl").splitlines()[0]) == {"line": REDACTED}
    archive.file.close()


def test_an_archive_over_the_limit_is_refused() -> None:
    archive = Archive(Secrets([]), 1024, NOW)
    with pytest.raises(BundleRefused) as refused:
        archive.text("noise.txt", "".join(f"{i:x}" for i in range(5000)))
    assert refused.value.code == "bundle.too_large" and refused.value.http_status == 422
    archive.discard()


def test_control_characters_are_escaped() -> None:
    assert escape_controls("a\x1b[2Jb\rc\nd\u202ee") == "a\\x1b[2Jb\\rc\\nd\\u202ee"
    assert escape_controls("训练 ok") == "训练 ok"


def test_a_webhook_shows_only_its_host() -> None:
    assert mask_webhook("https://open.feishu.cn/open-apis/bot/v2/hook/abc") == (
        "https://open.feishu.cn/******"
    )
    assert mask_webhook("not a url") == "******"
    hook = "https://open.feishu.cn:443/open-apis/bot/v2/hook/abc?x=1"
    assert webhook_credential(hook) == "/open-apis/bot/v2/hook/abc?x=1"
    assert webhook_credential("https://open.feishu.cn") == ""  # nothing secret: not searched


def test_a_tail_numbers_its_lines_from_the_total_and_cuts_long_ones() -> None:
    lines = [(NOW, "stdout", "step 8"), (NOW, "stderr", "y" * (MAX_LINE_CHARS + 10))]
    tail = Tail(run=1, attempt=2, worker=3, total=9, lines=lines)
    assert tail.name == "logs/run-1-attempt-2/worker-3.log"
    first, second = tail.text(Secrets([])).splitlines()
    assert first == f"8 {NOW.isoformat()} stdout | step 8"
    assert second.startswith(f"9 {NOW.isoformat()} stderr | yyy")
    assert second.endswith("[cut: 10 more characters]")
