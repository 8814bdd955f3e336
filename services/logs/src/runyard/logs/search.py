"""A log query: filters (run, attempt, workers, time range) and searches (words, exact
phrase, regular expression), in time order with a cursor.

Only the line is ever searched, never the prefix a reader sees (time, run,
worker): those are columns of their own. Filters and searches are ANDed, so
their order does not matter. Time bounds are whole seconds: `since` from the
start of its second, `until` to the end of its second.

The SQL is built here (pure); `LogStore` runs it.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from runyard.logs.errors import InvalidQuery

Order = Literal["oldest", "newest"]
MAX_LIMIT = 1000
#: The time bounds a search accepts (no line is older than Runyard or from year 3000).
EARLIEST = datetime(1970, 1, 1, tzinfo=UTC)
LATEST = datetime(3000, 1, 1, tzinfo=UTC)
#: Runs and workers are Postgres `int` (and proto `int32`) columns.
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1


def check_time(name: str, value: datetime | None) -> None:
    """A time bound within `EARLIEST`..`LATEST` (year 9999 and year 1 with an offset
    overflow on the way to the database); leave the bound out for an open range."""
    if value is None or value.tzinfo is None:
        return
    if not EARLIEST <= value <= LATEST:
        raise InvalidQuery(
            "logs.time_range",
            f"{name} must be between {EARLIEST.date()} and {LATEST.date()}",
            f"leave {name} out for an open range",
            name,
        )


#: The least value a line's number fields take: runs and attempts count from 1,
#: workers from 0.
LEAST = {"run": 1, "attempt": 1, "worker": 0}


def check_int32(name: str, value: int | None) -> None:
    """Refuse a number no line has: below its field's least (`LEAST`), or more than the
    `int` columns hold (a clean 400, not an empty answer or a database error)."""
    least = LEAST.get(name, INT32_MIN)
    if value is not None and not least <= value <= INT32_MAX:
        raise InvalidQuery(
            "logs.out_of_range",
            f"{name} {value} is out of range",
            f"{name} must be between {least} and {INT32_MAX}",
            name,
        )


_COLUMNS = "at, id, task_id, run, attempt, worker, stream, seq, line"
#: The most words one search asks for (each is a condition of its own).
MAX_WORDS = 32
#: The words of a `words` search, split by the database: at every character that
#: is not a letter, digit or `_` as its regular expressions see them, so that
#: each word is one for `\m`/`\M` too (which letters are letters depends on the
#: database's locale: under the C locale, only ASCII ones).
WORDS_SQL = "SELECT array_remove(regexp_split_to_array($1, '[^[:alnum:]_]+'), '')"


@dataclass(frozen=True)
class LogQuery:
    """What to read from one task's logs."""

    task_id: str
    workers: tuple[int, ...] = ()
    run: int | None = None
    #: One attempt (of every run, unless `run` is given too).
    attempt: int | None = None
    since: datetime | None = None
    until: datetime | None = None
    words: str | None = None
    phrase: str | None = None
    regex: str | None = None
    ignore_case: bool = False
    order: Order = "oldest"
    limit: int = 200
    cursor: str | None = None
    #: Extra lower bound on time (exports without filters: the last 30 days).
    not_before: datetime | None = field(default=None, repr=False)
    #: The tenant whose search this is, for its share of the searches run at once
    #: (`runyard.logs.slots`); None: the platform's own read, not counted.
    asker: str | None = field(default=None, repr=False, compare=False)
    #: Whether the search waits for a slot as long as it takes (a background export,
    #: a live tail's later pages) rather than `search_wait_s`.
    patient: bool = field(default=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        check_int32("run", self.run)
        check_int32("attempt", self.attempt)
        for worker in self.workers:
            check_int32("worker", worker)
        if not 1 <= self.limit <= MAX_LIMIT:
            raise InvalidQuery(
                "logs.limit",
                f"limit must be 1..{MAX_LIMIT}",
                "page with next_cursor for more lines",
                "limit",
            )
        if self.order not in ("oldest", "newest"):
            raise InvalidQuery(
                "logs.order", "order is oldest or newest", "oldest or newest", "order"
            )
        for name in ("since", "until"):
            value = getattr(self, name)
            if value is not None and value.tzinfo is None:
                raise InvalidQuery(
                    "logs.time_zone", f"{name} needs a time zone", "e.g. 2026-01-02T03:04:05Z", name
                )
            check_time(name, value)
        if self.since and self.until and self.since.replace(microsecond=0) > self.until:
            raise InvalidQuery("logs.time_range", "since is after until", "swap them", "since")
        if self.words is not None and not self.words.strip():
            raise InvalidQuery("logs.empty_search", "words is empty", "leave it out", "words")
        if self.phrase is not None and not self.phrase:
            raise InvalidQuery("logs.empty_search", "phrase is empty", "leave it out", "phrase")
        if self.regex is not None and not self.regex:
            raise InvalidQuery("logs.empty_search", "regex is empty", "leave it out", "regex")

    @property
    def searches(self) -> bool:
        """Whether it searches the lines' text (words, a phrase, a regular expression)."""
        return self.words is not None or self.phrase is not None or self.regex is not None

    @property
    def has_filters(self) -> bool:
        """Whether anything narrows the task's lines (an export's 'with filters')."""
        return bool(
            self.workers
            or self.run is not None
            or self.attempt is not None
            or self.since
            or self.until
            or self.words
            or self.phrase
            or self.regex
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "workers": list(self.workers),
            "run": self.run,
            "attempt": self.attempt,
            "since": self.since.isoformat() if self.since else None,
            "until": self.until.isoformat() if self.until else None,
            "words": self.words,
            "phrase": self.phrase,
            "regex": self.regex,
            "ignore_case": self.ignore_case,
        }

    def after(self, cursor: str | None) -> LogQuery:
        return replace(self, cursor=cursor)


@dataclass(frozen=True, slots=True)
class Position:
    """Where a page ended: the last line's time and id."""

    at: datetime
    id: int

    def encode(self) -> str:
        raw = f"{self.at.isoformat()}|{self.id}".encode()
        return base64.urlsafe_b64encode(raw).decode().rstrip("=")

    @classmethod
    def decode(cls, cursor: str) -> Position:
        try:
            raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
            at, _, ident = raw.partition("|")
            return cls(datetime.fromisoformat(at), int(ident))
        except (ValueError, UnicodeDecodeError) as exc:
            raise InvalidQuery(
                "logs.bad_cursor",
                "the cursor is not one this API gave",
                "pass next_cursor or tail_cursor back as it came",
                "cursor",
            ) from exc


def check_words(query: LogQuery, words: Sequence[str]) -> None:
    """Refuse a `words` search whose words (`WORDS_SQL`) are none or too many."""
    if query.words is not None and not words:
        raise InvalidQuery(
            "logs.no_words",
            f"{query.words!r} has no searchable words",
            "search punctuation with phrase or regex",
            "words",
        )
    if len(words) > MAX_WORDS:
        raise InvalidQuery(
            "logs.too_many_words",
            f"words holds {len(words)} words; at most {MAX_WORDS}",
            "search fewer words, or an exact phrase",
            "words",
        )


def where(query: LogQuery, words: Sequence[str] = ()) -> tuple[str, list[Any]]:
    """The WHERE clause (without cursor) and its arguments; `words`: those of
    `query.words`, as `WORDS_SQL` split them."""
    args: list[Any] = [query.task_id]
    clauses = ["task_id = $1"]

    def arg(value: Any) -> str:
        args.append(value)
        return f"${len(args)}"

    if query.workers:
        clauses.append(f"worker = ANY({arg(list(query.workers))}::int[])")
    if query.run is not None:
        clauses.append(f"run = {arg(query.run)}")
    if query.attempt is not None:
        clauses.append(f"attempt = {arg(query.attempt)}")
    if query.since is not None:
        clauses.append(f"at >= {arg(query.since.replace(microsecond=0))}")
    if query.not_before is not None:
        clauses.append(f"at >= {arg(query.not_before)}")
    if query.until is not None:
        end = query.until.replace(microsecond=0) + timedelta(seconds=1)
        clauses.append(f"at < {arg(end)}")
    # Each word is a case-insensitive regular expression bounded by word edges
    # (`\mloss\M`): the trigram index finds the candidate lines. A word is only
    # letters, digits and `_`, so nothing in it needs escaping.
    for word in words:
        pattern = arg(r"\m" + word + r"\M")
        clauses.append(f"line ~* {pattern}")
    if query.phrase is not None:
        op = "ILIKE" if query.ignore_case else "LIKE"
        clauses.append(f"line {op} {arg('%' + like_escape(query.phrase) + '%')}")
    if query.regex is not None:
        op = "~*" if query.ignore_case else "~"
        clauses.append(f"line {op} {arg(query.regex)}")
    return " AND ".join(clauses), args


def page_sql(query: LogQuery, words: Sequence[str] = ()) -> tuple[str, list[Any]]:
    """One page: `limit + 1` rows, so the caller knows whether more follow."""
    clause, args = where(query, words)
    newest = query.order == "newest"
    if query.cursor:
        position = Position.decode(query.cursor)
        args += [position.at, position.id]
        op = "<" if newest else ">"
        clause += f" AND (at, id) {op} (${len(args) - 1}, ${len(args)})"
    direction = "DESC" if newest else "ASC"
    args.append(query.limit + 1)
    sql = (
        f"SELECT {_COLUMNS} FROM log_lines WHERE {clause}"
        f" ORDER BY at {direction}, id {direction} LIMIT ${len(args)}"
    )
    return sql, args


def count_sql(query: LogQuery, words: Sequence[str] = ()) -> tuple[str, list[Any]]:
    clause, args = where(query, words)
    return f"SELECT count(*) FROM log_lines WHERE {clause}", args


def like_escape(text: str) -> str:
    """`text` as a literal inside a LIKE pattern."""
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
