"""The alert evaluator: one pass per tick over every rule, on finished windows only.

Series statistics are those of each tumbling window of length ``window_s``, read through :mod:`store.range_query`
(``SeriesWindows``: the job's own per-window quantiles and distinct counts, a window's sketch only for a rank the job
does not store). A window is finished when the ``windows`` query's watermark has reached its
end (the same clock as ``window_results.is_final``), so a window still receiving events is never judged.
Pipeline statistics are measured by processing time: ``dead_letters`` and ``dropped_stragglers`` count what the
job detected during the window (finished once the window is over), as does ``skipped_offsets`` (Kafka offsets
retention deleted before the job read them, ``kafka_data_loss``), ``lag`` (records in Kafka the job has not yet
read) and ``freshness`` (now − watermark, seconds) are sampled when the tick runs, as the value of the window that
ends at that tick.

States and transitions are stored in ClickHouse (``sql/0004_alerts.sql``); :func:`evaluate` is idempotent per
window, so a restart re-evaluates nothing it already evaluated.
"""

from __future__ import annotations

import gc
import json
import logging
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any, NamedTuple
from urllib.parse import urlencode

from clickhouse_connect.driver.client import Client

from alerting.labels import alert_annotations, alert_labels, series_label
from alerting.rules import AlertRule, AlertRules, quantile_of
from alerting.state import AlertState, Transition, run
from eventide.config import Config
from eventide.envelope import ms_of, now_ms, utc_of
from eventide.links import ALERTS_PAGE, dashboard_link, logs_url
from store import pipeline
from store.client import connect
from store.log_query import window_counts
from store.range_query import (
    STORED_QUANTILES,
    SeriesKey,
    SeriesWindows,
    WindowStats,
    fetch_series_windows,
    fetch_windows,
)

log = logging.getLogger("eventide.alerting")

WEEK_MS = 7 * 24 * 3600 * 1000


class Sample(NamedTuple):
    """The statistic of one finished window: the (window end, value) pair the state machine steps through."""

    window_end_ms: int
    value: float | None


# Statistics ------------------------------------------------------------------------------------------------
Selector = tuple[str, str, str, int]
"""What a series rule selects: (kind, name, app or ``*``, window length in s)."""


def selector_of(rule: AlertRule) -> Selector:
    assert rule.series is not None
    return rule.series.kind, rule.series.name, rule.series.app, rule.window_s


def matching_series(client: Client, selectors: Collection[Selector]) -> dict[Selector, list[SeriesKey]]:
    """Every stored series each selector matches (``app = "*"``: each app separately), ordered by app and tags: one
    query per window length for all of them."""
    found: dict[Selector, list[SeriesKey]] = {}
    for window_s in sorted({w for *_, w in selectors}):
        mine = [sel for sel in selectors if sel[3] == window_s]
        rows = client.query(
            "SELECT DISTINCT app, kind, name, series_tags FROM window_aggregates "
            "WHERE window_kind = 'tumbling' AND window_length_ms = {w:UInt64} AND kind IN {k:Array(String)} "
            "AND name IN {n:Array(String)} ORDER BY app, series_tags, kind, name",
            parameters={"w": window_s * 1000, "k": sorted({sel[0] for sel in mine}),
                        "n": sorted({sel[1] for sel in mine})}).result_rows
        series = [SeriesKey(*row) for row in rows]
        for kind, name, app, _ in mine:
            found[(kind, name, app, window_s)] = [s for s in series if (s.kind, s.name) == (kind, name)
                                                  and app in ("*", s.app)]
    return found


def logging_apps(client: Client) -> list[str]:
    """Every app with stored log windows: those a rule on log lines with ``app = "*"`` counts apart (an app
    without a matching line in a window counts 0 there)."""
    rows = client.query("SELECT DISTINCT app FROM window_aggregates WHERE window_kind = 'tumbling' AND kind = 'log' "
                        "ORDER BY app").result_rows
    return [row[0] for row in rows]


def search_samples(client: Client, rule: AlertRule, matches: list[SeriesKey], start_ms: int,
                   end_ms: int) -> dict[SeriesKey, list[Sample]]:
    """Per series (one app's lines each) of a rule on log lines: the lines its search finds in every window of
    ``rule.window_s`` ending in ``(start_ms, end_ms]`` (0 when none), as a count or per second; one query."""
    assert rule.logs is not None
    width = rule.window_s * 1000
    lo, hi = -(-start_ms // width) * width, end_ms // width * width
    if hi <= lo or not matches:
        return {s: [] for s in matches}
    apps = sorted({s.app for s in matches})
    query = rule.logs.query(apps[0] if len(apps) == 1 else "*", utc_of(lo), utc_of(hi))
    counts = window_counts(client, query, rule.window_s)
    per = rule.window_s if rule.statistic == "rate" else 1
    return {s: [Sample(end, counts.get((s.app, end), 0) / per) for end in range(lo + width, hi + 1, width)]
            for s in matches}


def watermark_ms(client: Client) -> int | None:
    mark = pipeline.watermarks(client).get(pipeline.WINDOWS_QUERY)
    return ms_of(mark) if mark is not None else None


def _series_value(rule: AlertRule) -> Callable[[WindowStats], float | None]:
    """How ``rule``'s statistic is read from one window's stats: decided once per rule, applied per window."""
    stat, seconds = rule.statistic, rule.window_s
    q = quantile_of(stat)
    if q is not None:
        return lambda b: b.quantiles.get(q)
    if stat == "count":
        return lambda b: float(b.count)
    if stat == "rate":
        return lambda b: b.count / seconds
    if stat == "sum":
        return lambda b: b.sum
    if stat == "mean":
        return lambda b: b.sum / b.value_count if b.value_count else None
    if stat in ("min", "max"):
        return lambda b: getattr(b, stat)
    if stat == "distinct_users":
        return lambda b: float(b.distinct_users)
    if stat == "distinct_devices":
        return lambda b: float(b.distinct_devices)
    if stat == "error_ratio":
        return lambda b: (b.levels.get("error", 0) + b.levels.get("critical", 0)) / b.count if b.count else None
    raise ValueError(f"not a series statistic: {stat}")


def _needs_value_sketch(rule: AlertRule) -> bool:
    """Whether the rule's statistic is a quantile the job does not store per window, read from the window's sketch."""
    q = quantile_of(rule.statistic)
    return q is not None and q not in STORED_QUANTILES


def rule_samples(client: Client, rule: AlertRule, matches: list[SeriesKey], start_ms: int, end_ms: int,
                 fetched: SeriesWindows | None = None) -> dict[SeriesKey, list[Sample]]:
    """Per series (of the rule's matches), the statistic of every window of ``rule.window_s`` ending in
    ``(start_ms, end_ms]``: from one query for all of them (or ``fetched``, the same windows already read for
    another rule), deserializing a window's sketch only for a quantile the job does not store."""
    if rule.statistic == "dropped_stragglers":
        return {s: _counted_by_window(client, rule, start_ms, end_ms, _STRAGGLERS_SQL, {
            "app": s.app, "kind": s.kind, "name": s.name, "tags": s.series_tags}) for s in matches}
    q = quantile_of(rule.statistic)
    if fetched is None:
        assert rule.series is not None
        fetched = fetch_series_windows(client, rule.series.kind, rule.series.name, sorted({s.app for s in matches}),
                                       rule.window_s, utc_of(start_ms), utc_of(end_ms),
                                       value_sketches=_needs_value_sketch(rule))
    by_series = fetched.windows(matches, quantiles=(q,) if q is not None else ())
    value = _series_value(rule)
    return {s: [Sample(w.end_ms, value(w)) for w in windows] for s, windows in by_series.items()}


_STRAGGLERS_SQL = (
    "SELECT intDiv(toUnixTimestamp64Milli(detected_at), {w:UInt64}) AS k, "
    "count(DISTINCT source_partition, source_offset) FROM stragglers "
    "WHERE app = {app:String} AND kind = {kind:String} AND name = {name:String} AND series_tags = {tags:String} "
    "AND detected_at >= fromUnixTimestamp64Milli({lo:Int64}) AND detected_at < fromUnixTimestamp64Milli({hi:Int64}) "
    "GROUP BY k")
_DEAD_LETTERS_SQL = (
    "SELECT intDiv(toUnixTimestamp64Milli(detected_at), {w:UInt64}) AS k, count() FROM dead_letters FINAL "
    "WHERE detected_at >= fromUnixTimestamp64Milli({lo:Int64}) AND detected_at < fromUnixTimestamp64Milli({hi:Int64}) "
    "GROUP BY k")

_SKIPPED_OFFSETS_SQL = (
    "SELECT intDiv(toUnixTimestamp64Milli(detected_at), {w:UInt64}) AS k, sum(skipped_offsets) "
    "FROM kafka_data_loss FINAL "
    "WHERE detected_at >= fromUnixTimestamp64Milli({lo:Int64}) AND detected_at < fromUnixTimestamp64Milli({hi:Int64}) "
    "GROUP BY k")


def _counted_by_window(client: Client, rule: AlertRule, start_ms: int, end_ms: int, sql: str,
                       parameters: dict[str, Any]) -> list[Sample]:
    """Counts per processing-time window; a window without rows counts 0."""
    w = rule.window_s * 1000
    lo, hi = -(-start_ms // w) * w, end_ms // w * w
    if hi <= lo:
        return []
    counts = dict(client.query(sql, parameters={**parameters, "w": w, "lo": lo, "hi": hi}).result_rows)
    return [Sample((k + 1) * w, float(counts.get(k, 0))) for k in range(lo // w, hi // w)]


def pipeline_samples(config: Config, client: Client, rule: AlertRule, start_ms: int, end_ms: int,
                     now: int) -> list[Sample]:
    if rule.statistic == "dead_letters":
        return _counted_by_window(client, rule, start_ms, end_ms, _DEAD_LETTERS_SQL, {})
    if rule.statistic == "skipped_offsets":
        return _counted_by_window(client, rule, start_ms, end_ms, _SKIPPED_OFFSETS_SQL, {})
    tick_end = now // (rule.window_s * 1000) * (rule.window_s * 1000)
    if tick_end <= start_ms:
        return []
    if rule.statistic == "freshness":
        mark = watermark_ms(client)
        return [Sample(tick_end, (now - mark) / 1000 if mark is not None else None)]
    if rule.statistic == "lag":
        lag = pipeline.consumer_lag(config, client)
        return [Sample(tick_end, float(sum(lag.values())) if lag else None)]
    raise ValueError(f"not a pipeline statistic: {rule.statistic}")


class _PassReads:
    """What one evaluation pass reads from the store, once for every rule that needs it: the series a selector
    matches, and the windows of one series name, length and range. The 200 rules of a deployment mostly share a few
    dozen series names; each rule then reads only the statistic it compares."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self._matches: dict[Selector, list[SeriesKey]] = {}
        self._windows: dict[tuple[str, str, tuple[str, ...], int, int, int], SeriesWindows] = {}
        self._samples: dict[tuple[str, int, int], dict[SeriesKey, list[Sample]]] = {}
        self._logging_apps: list[str] | None = None

    def match_all(self, rules: list[AlertRule]) -> None:
        """Find the series of every series rule of ``rules`` at once (:func:`matching_series`)."""
        wanted = {selector_of(r) for r in rules if r.series is not None} - self._matches.keys()
        if wanted:
            self._matches.update(matching_series(self.client, wanted))

    def matching(self, rule: AlertRule) -> list[SeriesKey]:
        if rule.logs is not None:
            if rule.logs.app != "*":
                return [rule.logs.series(rule.logs.app)]
            if self._logging_apps is None:
                self._logging_apps = logging_apps(self.client)
            return [rule.logs.series(app) for app in self._logging_apps]
        self.match_all([rule])
        return self._matches[selector_of(rule)]

    def prefetch(self, needs: list[tuple[AlertRule, list[SeriesKey], int, int]]) -> None:
        """Read the windows of every (rule, the series it matches, start, end) at once: one query per window length
        and range for all the series names (``store.range_query.fetch_windows``), where one per name would scan the
        table once each."""
        groups: dict[tuple[int, int, int], list[tuple[AlertRule, list[SeriesKey]]]] = {}
        for rule, matches, start_ms, end_ms in needs:
            if rule.series is not None and rule.statistic != "dropped_stragglers" and matches:
                groups.setdefault((rule.window_s, start_ms, end_ms), []).append((rule, matches))
        for (window_s, start_ms, end_ms), members in groups.items():
            fetched = fetch_windows(self.client, {(s.kind, s.name) for _, m in members for s in m},
                                    sorted({s.app for _, m in members for s in m}), window_s, utc_of(start_ms),
                                    utc_of(end_ms), value_sketches=any(_needs_value_sketch(r) for r, _ in members))
            for _, matches in members:
                kind, name = matches[0].kind, matches[0].name
                key = (kind, name, tuple(sorted({s.app for s in matches})), window_s, start_ms, end_ms)
                self._windows.setdefault(key, fetched[(kind, name)])

    def samples(self, rule: AlertRule, start_ms: int, end_ms: int) -> dict[SeriesKey, list[Sample]]:
        """The samples of ``rule`` in ``(start_ms, end_ms]`` of every series it matches."""
        key = (rule.name, start_ms, end_ms)
        if key in self._samples:
            return self._samples[key]
        matches = self.matching(rule)
        if rule.logs is not None:
            found = search_samples(self.client, rule, matches, start_ms, end_ms)
        elif rule.statistic == "dropped_stragglers" or not matches:
            found = rule_samples(self.client, rule, matches, start_ms, end_ms)
        else:
            kind, name = matches[0].kind, matches[0].name
            windows = (kind, name, tuple(sorted({s.app for s in matches})), rule.window_s, start_ms, end_ms)
            known = self._windows.get(windows)
            if known is None or (_needs_value_sketch(rule) and not known.value_sketches):
                self._windows[windows] = fetch_series_windows(self.client, kind, name, windows[2], rule.window_s,
                                                              utc_of(start_ms), utc_of(end_ms),
                                                              value_sketches=_needs_value_sketch(rule))
            found = rule_samples(self.client, rule, matches, start_ms, end_ms, self._windows[windows])
        self._samples[key] = found
        return found


# Evaluation ------------------------------------------------------------------------------------------------
def load_states(client: Client) -> dict[tuple[str, str], AlertState]:
    # Times as epoch ms from the store: one state per (rule, series), tens of thousands of them, read every pass.
    rows = client.query("SELECT rule, series, state, breaches, toUnixTimestamp64Milli(evaluated_until), "
                        "toUnixTimestamp64Milli(since), value, calm FROM alert_states FINAL").result_rows
    return {(r[0], r[1]): AlertState(*r) for r in rows}


def described(config: Config, rule: AlertRule, transition: Transition,
              series: SeriesKey | None) -> tuple[str, str]:
    """A transition's alert labels and annotations (``alerting.labels``), each as a JSON object of strings, with
    links into the dashboard (:func:`dashboard_links`) unless the rule sets annotations of those names."""
    labels = alert_labels(rule.name, rule.severity, series, rule.labels)
    annotations = alert_annotations(
        labels, rule.annotations, series=transition.series, statistic=rule.statistic, comparator=rule.comparator,
        threshold=rule.threshold, value=transition.value, window_s=rule.window_s,
        window_end_ms=transition.window_end_ms, status=transition.to)
    annotations = dashboard_links(config, rule, transition, series) | annotations
    return json.dumps(labels, ensure_ascii=False), json.dumps(annotations, ensure_ascii=False)


def dashboard_links(config: Config, rule: AlertRule, transition: Transition,
                    series: SeriesKey | None) -> dict[str, str]:
    """``dashboard_url``: the Alerts page over the windows that decided the transition; for a rule on a log series,
    ``logs_url``: the Logs page on that app and logger over the same windows (error and critical lines only for
    ``error_ratio``; a rule on log lines: its very search), so a notification opens exactly the lines behind it."""
    end = utc_of(transition.window_end_ms)
    start = end - timedelta(seconds=rule.window_s * max(rule.for_windows, 1))
    minutes = max(15, -(-(rule.window_s * (rule.for_windows + 2)) // 60))
    links = {"dashboard_url": dashboard_link(config, f"{ALERTS_PAGE}?{urlencode({'minutes': minutes})}")}
    if series is not None and rule.logs is not None:
        links["logs_url"] = dashboard_link(config, rule.logs.link(series.app, start, end))
    elif series is not None and series.kind == "log":
        levels = ["error", "critical"] if rule.statistic == "error_ratio" else []
        links["logs_url"] = dashboard_link(config, logs_url(apps=[series.app], names=[series.name], levels=levels,
                                                            since=start, until=end))
    return links


SamplesOf = Callable[[int, int], dict[SeriesKey | None, list[Sample]]]
"""A rule's samples in ``(lo, hi]``, per series (None: a pipeline statistic)."""

Evaluated = tuple[AlertRule, list[AlertState], list[tuple[Transition, SeriesKey | None]]]
"""One rule's pass: its new states, and its transitions with their series (None: a pipeline statistic)."""


def _save(config: Config, client: Client, evaluated: list[Evaluated], now_ms: int) -> None:
    """Store a pass's new states and transitions, two inserts for all its rules. Transitions first: a pass that stops
    between the two re-evaluates the same windows next time (its states did not move) and writes the same
    transitions again (same keys), so none is lost."""
    now = utc_of(now_ms)   # the evaluation's clock: when routes first knew of a transition (group_wait)
    transition_rows = [
        [t.key, t.rule, t.series, t.to, utc_of(t.window_end_ms), t.value, t.threshold, t.severity, int(t.notify), now,
         *described(config, rule, t, series)] for rule, _, transitions in evaluated for t, series in transitions]
    if transition_rows:
        client.insert("alert_transitions", transition_rows, column_names=[
            "transition_key", "rule", "series", "to_state", "window_end", "value", "threshold", "severity",
            "notify", "recorded_at", "labels", "annotations"])
    # DateTime64(3) columns as epoch ms, which the driver writes as they are: every state of every pass.
    # Column by column, in AlertState's field order: tens of thousands of states every pass.
    states = [s for _, moved, _ in evaluated for s in moved]
    if states:
        columns = [*map(list, zip(*states, strict=True)),
                   [rule.threshold for rule, moved, _ in evaluated for _ in moved],
                   [rule.severity for rule, moved, _ in evaluated for _ in moved], [now_ms] * len(states)]
        client.insert("alert_states", columns, column_oriented=True, column_names=[
            "rule", "series", "state", "breaches", "evaluated_until", "since", "value", "calm", "threshold",
            "severity", "updated_at"])


def _with_week_over_week(rule: AlertRule, samples: list[Sample],
                         base: Callable[[int, int], list[Sample]]) -> list[Sample]:
    """value / value of the same window a week earlier; no base (missing or 0): no value, so no breach."""
    if not rule.week_over_week or not samples:
        return samples
    lo = samples[0].window_end_ms - rule.window_s * 1000 - WEEK_MS
    hi = samples[-1].window_end_ms - WEEK_MS
    earlier = {s.window_end_ms + WEEK_MS: s.value for s in base(lo, hi)}
    return [Sample(s.window_end_ms, s.value / b if s.value is not None and (b := earlier.get(s.window_end_ms))
                   else None) for s in samples]


def evaluate(config: Config, rules: AlertRules, now: int | None = None) -> list[Transition]:
    """One evaluation pass: every rule, every matching series, every window finished since the last pass.
    Stores states and transitions; returns the new transitions (oldest first per series)."""
    # A pass makes a few tuples per (rule, series) and window, tens of thousands, and keeps none: freed by their
    # reference counts, they would still set off the cyclic collector, whose full scans of the heap are a large
    # share of a pass (docs/alerting.md).
    with _cyclic_gc_paused():
        return _evaluate(config, rules, now_ms() if now is None else now)


@contextmanager
def _cyclic_gc_paused() -> Iterator[None]:
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _evaluate(config: Config, rules: AlertRules, now: int) -> list[Transition]:
    found: list[Transition] = []
    evaluated: list[Evaluated] = []
    # Reads as the store's read-only user; only the evaluator's own state and transitions are written.
    with connect(config, role="reader") as client:
        states = load_states(client)
        mark = watermark_ms(client)
        reads = _PassReads(client)
        # First what each rule needs, so that windows are read in one query per window length and range; then the
        # rules, in file order.
        plans: list[tuple[AlertRule, int, int, int, list[tuple[SeriesKey | None, AlertState]], SamplesOf]] = []
        needs: list[tuple[AlertRule, list[SeriesKey], int, int]] = []
        if mark is not None:
            reads.match_all(rules.rule)
        for rule in rules.rule:
            width = rule.window_s * 1000
            floor = (now - (rule.for_windows + 2) * width) // width * width   # a new rule looks back a few windows
            samples_of: SamplesOf
            if rule.series is None and rule.logs is None:
                finished = now - round(config.stream.trigger_interval_s * 1000)   # the job's last writes are in
                matches: list[SeriesKey | None] = [None]
                samples_of = lambda lo, hi, r=rule: {None: pipeline_samples(config, client, r, lo, hi, now)}  # noqa: E731
            elif mark is None:
                continue
            else:
                finished, matches = mark, [*reads.matching(rule)]
            end = finished // width * width
            currents = [(s, states.get((rule.name, label := series_label(s))) or AlertState(rule.name, label))
                        for s in matches]
            # Every series of the rule from one read over the earliest range any of them needs.
            earliest = min((max(current.evaluated_until_ms, floor) for _, current in currents), default=end)
            if end <= earliest:
                continue     # no series of the rule has a window finished since the last pass
            if rule.series is not None or rule.logs is not None:
                needs.append((rule, [s for s in matches if s is not None], earliest, end))
                samples_of = lambda lo, hi, r=rule, e=earliest: reads.samples(r, min(lo, e), hi)  # noqa: E731
            plans.append((rule, end, floor, earliest, currents, samples_of))
        reads.prefetch(needs)
        for rule, end, floor, earliest, currents, samples_of in plans:
            by_series = samples_of(earliest, end)
            new_states, transitions = [], []
            for series_key, current in currents:
                start = max(current.evaluated_until_ms, floor)
                if end <= start:
                    continue
                samples = by_series[series_key]
                if rule.week_over_week:
                    samples = _with_week_over_week(rule, samples,
                                                   lambda lo, hi, k=series_key, f=samples_of: f(lo, hi)[k])
                state, moved = run(rule, current, [s for s in samples if start < s.window_end_ms <= end])
                if state != current:
                    new_states.append(state)
                transitions += [(t, series_key) for t in moved]
            evaluated.append((rule, new_states, transitions))
            found += [t for t, _ in transitions]
    with connect(config) as writer:
        _save(config, writer, evaluated, now)
    for t in found:
        # %r: rule and series names may hold line breaks, which would forge log lines
        log.info("alert %r [%r] %s at %s (value %s, threshold %s)", t.rule, t.series, t.to,
                 utc_of(t.window_end_ms).isoformat(), t.value, t.threshold)
    return found


def undelivered(client: Client, channel: str) -> list[dict[str, Any]]:
    """Transitions to notify that ``channel`` has neither delivered nor given up (``alert_delivery_failures``),
    oldest first."""
    result = client.query(
        "SELECT transition_key, rule, series, to_state, window_end, value, threshold, severity, labels, annotations "
        "FROM alert_transitions FINAL WHERE notify = 1 AND transition_key NOT IN "
        "(SELECT transition_key FROM alert_notifications FINAL WHERE channel = {c:String}) "
        "AND transition_key NOT IN "
        "(SELECT transition_key FROM alert_delivery_failures FINAL WHERE channel = {c:String}) "
        "ORDER BY window_end, rule, series", parameters={"c": channel})
    return [dict(zip(result.column_names, row, strict=True)) for row in result.result_rows]

