"""A worker's output file cut into numbered lines, the same however it is read; time
marks; what is kept of a finished deployment's folder."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from runyard.deployer import outputs
from runyard.deployer.outputs import LINE_MAX, LineSplitter, Marks, numbered_lines

BIG = b"x" * (LINE_MAX * 2 + 7)
EXACT = b"y" * LINE_MAX
CONTENT = b"".join(
    [b"first\n", b"\n", BIG, b"\n", EXACT, b"\n", b"crlf\r\n", b"z" * (LINE_MAX + 1), b"tail"]
)


def read_in_chunks(data: bytes, sizes: list[int], *, start: int = 0) -> list[tuple[bytes, int]]:
    splitter = LineSplitter(start)
    lines: list[tuple[bytes, int]] = []
    at = start
    for size in sizes:
        lines += splitter.feed(data[at : at + size])
        at += size
    lines += splitter.feed(data[at:])
    return lines + splitter.finish()


def test_long_lines_are_cut_into_pieces_of_line_max() -> None:
    lines = [raw for raw, _ in read_in_chunks(CONTENT, [])]
    assert lines == [
        b"first",
        b"",
        b"x" * LINE_MAX,
        b"x" * LINE_MAX,
        b"x" * 7,
        EXACT,  # exactly LINE_MAX: one line, no empty one after it
        b"crlf\r",
        b"z" * LINE_MAX,  # no newline before the next text: the piece is a line
        b"z" + b"tail",
    ]


@pytest.mark.parametrize("seed", range(20))
def test_the_lines_do_not_depend_on_how_the_bytes_arrive(seed: int) -> None:
    whole = read_in_chunks(CONTENT, [])
    rng = random.Random(seed)
    sizes = [rng.choice([1, 2, 7, 100, 4096, LINE_MAX - 1, LINE_MAX + 3]) for _ in range(60)]
    assert read_in_chunks(CONTENT, sizes) == whole


def test_reading_on_from_a_saved_offset_gives_the_rest_of_the_lines() -> None:
    whole = read_in_chunks(CONTENT, [])
    for i, (_, end) in enumerate(whole[:-1]):
        assert read_in_chunks(CONTENT, [5, 70_000], start=end) == whole[i + 1 :]


def test_the_offsets_are_where_each_line_ends_in_the_file() -> None:
    previous = 0
    for raw, end in read_in_chunks(CONTENT, [3, 9000]):
        piece = CONTENT[previous:end]
        assert piece.rstrip(b"\n") == raw
        previous = end
    assert previous == len(CONTENT)


def test_numbered_lines_of_a_file(tmp_path: Path) -> None:
    path = tmp_path / "stdout.log"
    path.write_bytes(CONTENT)
    whole = [raw for raw, _ in read_in_chunks(CONTENT, [])]
    assert list(numbered_lines(path, complete=True)) == list(enumerate(whole))
    # A worker still writing: its unfinished last line does not count yet.
    assert list(numbered_lines(path, complete=False)) == list(enumerate(whole[:-1]))
    assert list(numbered_lines(tmp_path / "absent.log", complete=True)) == []


def test_a_skip_gives_its_notice_numbered_where_the_skipped_lines_began(tmp_path: Path) -> None:
    path = tmp_path / "stdout.log"
    path.write_bytes(CONTENT)
    whole = read_in_chunks(CONTENT, [])
    ends = [end for _, end in whole]
    # From after "first" (a newline) to after the BIG line's second piece (a LINE_MAX
    # piece end: the tail cut it seeing more bytes; a read ending there holds it back).
    first = outputs.Skip(ends[0], ends[3], "[runyard] skipped")
    raws = [raw for raw, _ in whole]
    expected = [raws[0], b"[runyard] skipped", *raws[4:]]
    assert [raw for _, raw in numbered_lines(path, complete=True, skips=[first])] == expected
    # Skipping from a LINE_MAX piece's end: the piece before it is one line, whole.
    second = outputs.Skip(ends[2], ends[5], "[runyard] again")
    lines = list(numbered_lines(path, complete=True, skips=[second]))
    assert [raw for _, raw in lines] == [*raws[:3], b"[runyard] again", *raws[6:]]
    assert [seq for seq, _ in lines] == list(range(len(lines)))
    # Read by default from the skips saved beside the file, per stream.
    saved = {"stdout": 0, "skips": {"stdout": [second.to_json()], "stderr": "no"}}
    (tmp_path / "offsets.json").write_text(json.dumps(saved))
    assert list(numbered_lines(path, complete=True)) == lines
    assert outputs.read_skips(tmp_path) == {"stdout": [second]}


@pytest.mark.parametrize(
    "raw", [None, [1, 2], [2, 1, "x"], [True, 2, "x"], [1, 2, 3], ["1", 2, "x"], [-1, 2, "x"]]
)
def test_a_saved_skip_that_is_not_one_is_ignored(raw: object) -> None:
    assert outputs.Skip.from_json(raw) is None


def test_a_mark_says_when_a_line_had_been_published() -> None:
    marks = Marks()
    marks.add({"stdout": 3, "stderr": 0}, now=100.0)
    marks.add({"stdout": 3, "stderr": 0}, now=101.0)  # nothing new: no mark
    marks.add({"stdout": 10, "stderr": 2}, now=102.0)
    assert len(marks.entries) == 2
    assert marks.time_of("stdout", 0) == 100.0
    assert marks.time_of("stdout", 2) == 100.0
    assert marks.time_of("stdout", 3) == 102.0
    assert marks.time_of("stderr", 1) == 102.0
    assert marks.time_of("stdout", 10) is None  # not published as far as known
    assert Marks.from_json(json.loads(json.dumps(marks.entries))) == marks
    assert Marks.from_json("nonsense") == Marks()


def test_marks_are_thinned_older_first_and_keep_the_last() -> None:
    marks = Marks()
    for i in range(1, 2000):
        marks.add({"stdout": i, "stderr": 0}, now=float(i))
    assert len(marks.entries) <= outputs.MAX_MARKS
    assert marks.entries[-1] == [1999.0, 1999.0, 0.0]
    assert marks.time_of("stdout", 1000) is not None
    gaps = [b[0] - a[0] for a, b in zip(marks.entries, marks.entries[1:], strict=False)]
    # Recent marks stay dense (what a broker loses is recent), older ones thin out,
    # and the whole span stays covered.
    assert max(gaps[-100:]) <= 2
    assert gaps == sorted(gaps, reverse=True)
    assert marks.entries[0][0] <= 64


def test_keeping_leaves_only_output_and_a_finished_state(tmp_path: Path) -> None:
    root = tmp_path / "t-1" / "run1-a2"
    worker = root / "w0"
    for sub in ("home", "tmp", "work"):
        (worker / sub).mkdir(parents=True)
        (worker / sub / "file").write_text("private")
    for name in ("stdout.log", "stderr.log", "offsets.json", "exit_status", "env"):
        (worker / name).write_text("x")
    (root / "shm").mkdir()
    (root / "state.json").write_text(json.dumps({"phase": "started"}))

    kept = outputs.keep(root, ("t-1", 1, 2), {(0, "stdout"): 5})

    assert sorted(p.name for p in worker.iterdir()) == [
        "exit_status",
        "offsets.json",
        "stderr.log",
        "stdout.log",
    ]
    assert sorted(p.name for p in root.iterdir()) == ["state.json", "w0"]
    assert outputs.load_kept(tmp_path) == {("t-1", 1, 2): kept}
    assert kept.path(0, "stdout") == worker / "stdout.log"

    outputs.forget(root)
    assert not (tmp_path / "t-1").exists()  # the task's folder too, once empty
    assert outputs.load_kept(tmp_path) == {}
