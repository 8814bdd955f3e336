"""Metrics: OpenTelemetry instruments, served as Prometheus text on each service's /metrics.

`setup_metrics(service)` installs the process's meter provider with a Prometheus
reader (once; later calls do nothing), and `metrics_text()` is what /metrics
answers. Instruments are created at import on the API's global meter.

Cheap on the hot path: the SDK's synchronous instruments cost 5-15 us a
measurement (they clean and hash the labels each time), against 0.3 us for
what is done here. Counts are kept in plain dictionaries (an integer add per
event) and handed to OpenTelemetry as observable counters when scraped; the
handler-time histogram is kept the same way (a bisect and two adds) and served
by a collector of the same Prometheus registry, since OpenTelemetry has no
observable histogram. Counts start with the process, also before
`setup_metrics`.

The instruments (docs/metrics.md says how to read them):

    runyard_events_handled_total{consumer, type, outcome}   counter
        events a consumer took from the broker: outcome `handled` (the handler
        ran), `duplicate` (its inbox row was there: a redelivery), `failed`
        (dead-lettered after the handler failed), `undecodable` (dead-lettered
        before it; type `unknown`)
    runyard_handler_seconds{consumer}                      histogram
        time of one handler call (a handled event), in its transaction
    runyard_consumer_lag{consumer, topic}                  gauge
        messages on the broker the consumer's group members in this process
        have not taken yet, over their assigned partitions (last known log end
        offset minus position; read from the consumer, no broker call)
    runyard_events_appended_total{type}                    counter
        events the process appended to the event store
    runyard_log_lines_total{consumer, outcome}             counter
        log lines read from the logs topic: `stored`, `duplicate` (already
        stored: a redelivery), `malformed` (skipped)

and every gauge a service adds with `register_gauge` (e.g. the scheduler's
queue length).
"""

from __future__ import annotations

import logging
import threading
import weakref
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from itertools import accumulate
from typing import Any

from opentelemetry import metrics
from opentelemetry.metrics import CallbackOptions, Observation

__all__ = [
    "LINE_OUTCOMES",
    "OUTCOMES",
    "ConsumerMetrics",
    "GaugeReading",
    "LagReading",
    "count_appended",
    "count_log_lines",
    "metrics_text",
    "register_gauge",
    "setup_metrics",
    "track_lag",
]

log = logging.getLogger("runyard.telemetry")

#: Handler calls take from a fraction of a millisecond to a few seconds.
LATENCY_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)

#: What a gauge callback returns: one value, or (value, labels) pairs.
GaugeReading = float | Iterable[tuple[float, Mapping[str, str]]]
#: A consumer's lag: topic -> messages not taken yet.
LagReading = Callable[[], Mapping[str, int]]

_meter = metrics.get_meter("runyard")
_installed: str | None = None
_install_lock = threading.Lock()

#: What became of an event a consumer took (runyard_events_handled_total's `outcome`).
OUTCOMES = ("handled", "duplicate", "failed", "undecodable")
#: Log lines by outcome (runyard_log_lines_total's `outcome`).
LINE_OUTCOMES = ("stored", "duplicate", "malformed")

#: consumer -> outcome -> event type -> events; shared by a consumer's instances in
#: the process and never dropped, so each count only grows.
_handled: dict[str, dict[str, dict[str, int]]] = {}
#: event type -> events appended.
_appended: dict[str, int] = {}
#: consumer -> outcome -> log lines.
_log_lines: dict[str, dict[str, int]] = {}


class _Histogram:
    """Observations per bucket (the last one: above every bound), and their sum."""

    __slots__ = ("counts", "sum")

    def __init__(self) -> None:
        self.counts = [0] * (len(LATENCY_BUCKETS_S) + 1)
        self.sum = 0.0


#: consumer -> its handler times.
_handler_seconds: dict[str, _Histogram] = {}
HANDLER_SECONDS = "runyard_handler_seconds"
HANDLER_SECONDS_HELP = "Time of one handler call of a consumer (one event, in its transaction)."


def setup_metrics(service: str) -> None:
    """Install the meter provider of this process, named `service`, with a Prometheus
    reader. Only the first call installs anything (several services may share a
    process, and tests start many): the process's metrics carry that first name."""
    global _installed
    with _install_lock:
        if _installed is not None:
            return
        from opentelemetry.exporter.prometheus import PrometheusMetricReader
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.resources import Resource
        from prometheus_client import REGISTRY

        reader = PrometheusMetricReader(scope_info_enabled=False)
        provider = MeterProvider(
            resource=Resource.create({"service.name": service}), metric_readers=[reader]
        )
        metrics.set_meter_provider(provider)
        if metrics.get_meter_provider() is not provider:
            log.warning("a meter provider was installed before runyard's: /metrics is partial")
        REGISTRY.register(_HandlerSecondsCollector())
        _installed = service


def metrics_text() -> str:
    """This process's metrics in the Prometheus text format (what /metrics serves)."""
    from prometheus_client import REGISTRY, generate_latest

    return generate_latest(REGISTRY).decode()


# -- counting --------------------------------------------------------------------


class ConsumerMetrics:
    """The counts and handler time of consumer `consumer` (all its instances in the
    process count together)."""

    __slots__ = ("_counts", "_seconds", "consumer")

    def __init__(self, consumer: str) -> None:
        self.consumer = consumer
        self._counts = _handled.setdefault(consumer, {outcome: {} for outcome in OUTCOMES})
        self._seconds = _handler_seconds.setdefault(consumer, _Histogram())

    def handled(self, event_type: str, outcome: str = "handled") -> None:
        """One event taken from the broker, and what became of it (one of `OUTCOMES`)."""
        types = self._counts[outcome]
        types[event_type] = types.get(event_type, 0) + 1

    def latency(self, seconds: float) -> None:
        """One handler call took `seconds`."""
        histogram = self._seconds
        histogram.counts[bisect_left(LATENCY_BUCKETS_S, seconds)] += 1
        histogram.sum += seconds


def count_appended(event_types: Sequence[str]) -> None:
    """Events of `event_types` were appended to the event store."""
    for event_type in event_types:
        _appended[event_type] = _appended.get(event_type, 0) + 1


def count_log_lines(consumer: str, *, stored: int, duplicate: int, malformed: int) -> None:
    """A batch of the logs topic: lines stored, already stored, and skipped."""
    counts = _log_lines.get(consumer)
    if counts is None:
        counts = _log_lines[consumer] = dict.fromkeys(LINE_OUTCOMES, 0)
    counts["stored"] += stored
    counts["duplicate"] += duplicate
    counts["malformed"] += malformed


def _observe_handled(_: CallbackOptions) -> Iterator[Observation]:
    for consumer, outcomes in list(_handled.items()):
        for outcome, types in list(outcomes.items()):
            for event_type, n in list(types.items()):
                labels = {"consumer": consumer, "type": event_type, "outcome": outcome}
                yield Observation(n, labels)


def _observe_appended(_: CallbackOptions) -> Iterator[Observation]:
    for event_type, n in list(_appended.items()):
        yield Observation(n, {"type": event_type})


def _observe_log_lines(_: CallbackOptions) -> Iterator[Observation]:
    for consumer, outcomes in list(_log_lines.items()):
        for outcome, n in list(outcomes.items()):
            yield Observation(n, {"consumer": consumer, "outcome": outcome})


class _HandlerSecondsCollector:
    """runyard_handler_seconds in the Prometheus registry (see the module docstring)."""

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import HistogramMetricFamily
        from prometheus_client.utils import floatToGoString

        family = HistogramMetricFamily(HANDLER_SECONDS, HANDLER_SECONDS_HELP, labels=["consumer"])
        # prometheus_client.utils is not annotated.
        bounds = [floatToGoString(b) for b in LATENCY_BUCKETS_S]  # type: ignore[no-untyped-call]
        bounds.append("+Inf")
        for consumer, histogram in list(_handler_seconds.items()):
            cumulative = list(accumulate(histogram.counts))
            family.add_metric([consumer], list(zip(bounds, cumulative, strict=True)), histogram.sum)
        yield family


_meter.create_observable_counter(
    "runyard_events_handled_total",
    callbacks=[_observe_handled],
    description="Events a consumer took from the broker, by consumer, event type and outcome.",
)
_meter.create_observable_counter(
    "runyard_events_appended_total",
    callbacks=[_observe_appended],
    description="Events this process appended to the event store, by event type.",
)
_meter.create_observable_counter(
    "runyard_log_lines_total",
    callbacks=[_observe_log_lines],
    description="Log lines read from the logs topic, by consumer and outcome.",
)


# -- gauges read at scrape time ---------------------------------------------------

#: token -> (consumer, reading, or a weak reference to a bound method reading it).
_lag_sources: dict[int, tuple[str, Callable[[], LagReading | None]]] = {}
_next_token = iter(range(1, 1 << 62))


def track_lag(consumer: str, reading: LagReading) -> Callable[[], None]:
    """Report `reading()` (topic -> messages not taken yet) as runyard_consumer_lag
    of `consumer` at each scrape, until the returned function is called (or, for a
    bound method, its object is gone). Several readings of one consumer (group
    members in one process) are summed. `reading` runs in the scrape: it must only
    read what the consumer already knows."""
    token = next(_next_token)
    if hasattr(reading, "__self__") and hasattr(reading, "__func__"):
        ref = weakref.WeakMethod(reading)
        _lag_sources[token] = (consumer, ref)
    else:
        _lag_sources[token] = (consumer, lambda: reading)

    def untrack() -> None:
        _lag_sources.pop(token, None)

    return untrack


def _observe_lag(_: CallbackOptions) -> Iterator[Observation]:
    totals: dict[tuple[str, str], int] = {}
    for token, (consumer, ref) in list(_lag_sources.items()):
        reading = ref()
        if reading is None:
            _lag_sources.pop(token, None)
            continue
        try:
            lags = reading()
        except Exception:  # a consumer stopping under the scrape: nothing to report
            continue
        for topic, lag in lags.items():
            totals[(consumer, topic)] = totals.get((consumer, topic), 0) + lag
    for (consumer, topic), lag in totals.items():
        yield Observation(lag, {"consumer": consumer, "topic": topic})


_meter.create_observable_gauge(
    "runyard_consumer_lag",
    callbacks=[_observe_lag],
    description="Messages not yet taken by a consumer group's members in this process"
    " (log end offset minus position, over their assigned partitions).",
)

_gauges: dict[str, Callable[[], GaugeReading]] = {}


def register_gauge(
    name: str, description: str, callback: Callable[[], GaugeReading], *, unit: str = ""
) -> Callable[[], None]:
    """Expose `callback()` as gauge `name` (e.g. `runyard_scheduler_queue_length`).

    `callback` runs at each scrape, in the scraping thread (the event loop's, for
    /metrics), so it must be cheap and must not block: read a value the service
    keeps, no database or broker call. It returns one number, or (value, labels)
    pairs such as `[(3, {"pool": "a100"}), (0, {"pool": "h100"})]`. Registering
    a name again replaces its callback (a service started again in the same
    process); the returned function removes it."""
    if name not in _gauges:
        _meter.create_observable_gauge(
            name, callbacks=[_gauge_callback(name)], description=description, unit=unit
        )
    _gauges[name] = callback

    def unregister() -> None:
        if _gauges.get(name) is callback:
            _gauges[name] = _nothing

    return unregister


def _nothing() -> GaugeReading:
    return ()


def _gauge_callback(name: str) -> Callable[[CallbackOptions], Iterator[Observation]]:
    def observe(_: CallbackOptions) -> Iterator[Observation]:
        try:
            reading: Any = _gauges[name]()
        except Exception:
            log.exception("gauge %s could not be read", name)
            return
        if isinstance(reading, int | float):
            yield Observation(reading)
            return
        for value, labels in reading:
            yield Observation(value, dict(labels))

    return observe
