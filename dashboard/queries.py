"""Read-side queries the dashboard needs. Each takes a client (``store.client.connect``); a page runs its
independent queries side by side (:func:`concurrently`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import pandas as pd
from clickhouse_connect.driver.client import Client

from eventide.config import Config
from eventide.envelope import LEVELS
from store import range_query
from store.client import connect
from store.range_query import SeriesKey

DISTRIBUTION_ROWS = 100_000
"""Rows a histogram query ships to the page at most (the newest): enough for its shape, cheap to draw."""
OPEN_SESSION_ROWS = 200
"""Open sessions listed on the Sessions page (the newest by last event; the counts cover all)."""


DUPLICATE_BUCKET_S = 60   # duplicates are reported per app and minute

_POOL = ThreadPoolExecutor(max_workers=6, thread_name_prefix="eventide-page-query")
"""Shared by every render in the process (a fixed set of threads): at most 6 page queries at once."""


def concurrently(config: Config, calls: Mapping[str, Callable[[Client], Any]]) -> dict[str, Any]:
    """Run a page's independent queries side by side, each on its own client; their results by name.

    One after the other, a page waited for the sum of its round trips; the store serves requests in parallel, so
    it now waits for about the slowest. A client each: a ClickHouse server refuses two queries at once in one
    client's session. Raises the first failed call's exception (e.g. ``StoreUnavailable``) once all are done.
    """
    def run(call: Callable[[Client], Any]) -> Any:
        with connect(config, role="reader") as client:
            return call(client)

    futures = {name: _POOL.submit(run, call) for name, call in calls.items()}
    return {name: future.result() for name, future in futures.items()}


@dataclass(frozen=True)
class SeriesCatalog:
    """What the explorer's pickers offer: the series, most active first, and the windows stored for them."""

    series: list[SeriesKey]
    lengths_ms: list[int]
    """Stored tumbling window lengths, as :func:`window_lengths_ms`."""
    hopping: dict[SeriesKey, list[tuple[int, int]]]
    """Per series with hopping windows: their (length_ms, hop_ms), in order."""
    events: dict[SeriesKey, int] = field(default_factory=dict)
    """Per series, its events in the catalog's range: the sum over its tumbling windows of its shortest length (each
    event counted once)."""

    def busiest(self, kind: str) -> SeriesKey | None:
        """The series of ``kind`` (``metric``, ``log``) with the most events in the range; None when none has any."""
        return next((s for s in self.series if s.kind == kind and self.events.get(s, 0) > 0), None)


def series_catalog(client: Client, since: datetime | None = None) -> SeriesCatalog:
    """Every series that has at least one window (most active first: most events since ``since``, or ever), the
    tumbling lengths and each series' hopping windowings, from one pass over the windows.

    One query where the explorer made three (series, lengths, hopping specs), each a scan of ``window_aggregates``.
    """
    rows = client.query(
        "SELECT app, kind, name, series_tags, window_kind, window_length_ms, window_hop_ms, "
        "sumIf(event_count, window_end > {since:DateTime64(3)}) "
        "FROM window_aggregates FINAL GROUP BY ALL ORDER BY window_length_ms, window_hop_ms",
        parameters={"since": (since or datetime(1970, 1, 1)).replace(tzinfo=None)}).result_rows
    events: dict[SeriesKey, int] = {}
    lengths: set[int] = set()
    hopping: dict[SeriesKey, list[tuple[int, int]]] = {}
    seen: dict[SeriesKey, None] = {}
    for app, kind, name, tags, window_kind, length, hop, count in rows:
        series = SeriesKey(app, kind, name, tags)
        seen[series] = None
        if window_kind == "tumbling":
            lengths.add(int(length))
            events.setdefault(series, int(count))     # rows come shortest length first
        elif window_kind == "hopping":
            hopping.setdefault(series, []).append((int(length), int(hop)))
    events = {s: events.get(s, 0) for s in seen}
    return SeriesCatalog(sorted(events, key=lambda s: -events[s]), sorted(lengths), hopping, events)


def window_lengths_ms(client: Client) -> list[int]:
    """Stored tumbling window lengths (the finest resolutions a chart can have)."""
    rows = client.query("SELECT DISTINCT window_length_ms FROM window_aggregates "
                        "WHERE window_kind = 'tumbling' ORDER BY 1").result_rows
    return [int(r[0]) for r in rows]


def resolutions_s(lengths_ms: list[int], extra_s: tuple[int, ...] = (300, 3600)) -> list[int]:
    """Chart resolutions: each stored length, plus coarser ones that are whole multiples of one of them."""
    lengths_s = [ms // 1000 for ms in lengths_ms if ms % 1000 == 0]
    return sorted({*lengths_s, *(r for r in extra_s if any(r % n == 0 for n in lengths_s))})


_LEVEL_COLUMNS = ", ".join(f"level_{level} AS {level}" for level in LEVELS)
"""A window's lines per level, each column named as the level (a log series' buckets)."""

CHARTED_QUANTILES = (0.5, 0.9, 0.99)
"""The percentiles the explorer charts: only these are read from each bucket's merged sketch."""


def series_buckets(client: Client, series: SeriesKey, resolution_s: int, since: datetime, until: datetime,
                   stored_lengths_ms: Sequence[int]) -> pd.DataFrame:
    """One row per bucket of ``resolution_s``: start, count, rate, p50/p90/p99, distinct users, final.

    When ``resolution_s`` is one of the stored tumbling lengths (``stored_lengths_ms``, e.g.
    :attr:`SeriesCatalog.lengths_ms`), each bucket *is* one stored window and its
    row is that window's own answer (newest version), read without any sketch: the same values a merge of one
    sketch gives, for a fraction of the cost (a day of 60 s buckets: 1,440 sketches). Otherwise buckets come from
    ``store.range_query``: sums add up and percentiles / distinct counts are read from the merged sketches of the
    bucket's windows, never averaged. Bucket starts are naive UTC on both paths.
    """
    if round(resolution_s * 1000) in stored_lengths_ms:
        return _frame(client,
            "SELECT window_start, event_count, rate, p50, p90, p99, distinct_users, is_final = 1 AS final, "
            f"{_LEVEL_COLUMNS} FROM window_results WHERE window_kind = 'tumbling' AND window_length_ms = {{l:UInt64}} "
            f"AND {_series_filter()} AND window_start >= {{lo:DateTime64(3)}} AND window_end <= {{hi:DateTime64(3)}} "
            "ORDER BY window_start", since, until, l=round(resolution_s * 1000), **_series_params(series))
    buckets = range_query.range_buckets(client, series, since, until, resolution_s, quantiles=CHARTED_QUANTILES,
                                        devices=False)
    return pd.DataFrame([{
        "window_start": b.start.replace(tzinfo=None), "event_count": b.count, "rate": b.rate,
        "p50": b.quantiles.get(0.5), "p90": b.quantiles.get(0.9), "p99": b.quantiles.get(0.99),
        "distinct_users": b.distinct_users, "final": b.final, **{level: b.levels[level] for level in LEVELS},
    } for b in buckets if b.windows])


def dead_letter_count(client: Client) -> int:
    return int(client.query("SELECT count() FROM dead_letters FINAL").result_rows[0][0])


DATA_LOSS_ROWS = 100
"""Skipped ranges the Overview lists at most (the newest); the total counts all of the range's."""


@dataclass(frozen=True)
class DataLoss:
    """Kafka offsets retention deleted before the job read them (``kafka_data_loss``), detected in a time range."""

    ranges: pd.DataFrame
    """The newest :data:`DATA_LOSS_ROWS` skipped ranges: detected_at, topic, partition, from_offset, to_offset
    (exclusive), skipped_offsets, batch_id; newest first."""
    skipped: int
    """Offsets skipped over every range detected in the time range (0 normally)."""


def kafka_data_loss(client: Client, since: datetime, until: datetime, limit: int = DATA_LOSS_ROWS) -> DataLoss:
    """The ranges of offsets Kafka deleted before the job read them, detected in ``[since, until)``, and their total.

    ``FINAL``: a replayed micro-batch rewrites its range's row (same topic, partition, first offset), counted once.
    The total is a window over every row of the range, computed before the ``LIMIT``.
    """
    df = _frame(client,
        "SELECT detected_at, topic, partition, from_offset, to_offset, skipped_offsets, batch_id, "
        "sum(skipped_offsets) OVER () AS total FROM kafka_data_loss FINAL "
        "WHERE detected_at >= {lo:DateTime64(3)} AND detected_at < {hi:DateTime64(3)} "
        "ORDER BY detected_at DESC, topic, partition, from_offset LIMIT {n:UInt32}", since, until, n=limit)
    skipped = int(df["total"].iloc[0]) if not df.empty else 0
    return DataLoss(df.drop(columns="total"), skipped)


def alert_states(client: Client) -> pd.DataFrame:
    """Current state of every (rule, series), firing first."""
    result = client.query(
        # since is 0 (1970) for a series that never left "ok": no time to show.
        "SELECT rule, series, state, severity, value, threshold, "
        "nullIf(since, toDateTime64(0, 3, 'UTC')) AS since, evaluated_until FROM alert_states FINAL "
        "ORDER BY state = 'firing' DESC, state = 'pending' DESC, rule, series")
    return pd.DataFrame(result.result_rows, columns=result.column_names)


def alert_history(client: Client, since: datetime, until: datetime) -> pd.DataFrame:
    """Transitions with their window end in ``[since, until)``, oldest first."""
    result = client.query(
        "SELECT window_end, rule, series, to_state, value, threshold, severity FROM alert_transitions FINAL "
        "WHERE window_end >= {lo:DateTime64(3)} AND window_end < {hi:DateTime64(3)} ORDER BY window_end",
        parameters={"lo": since.replace(tzinfo=None), "hi": until.replace(tzinfo=None)})
    return pd.DataFrame(result.result_rows, columns=result.column_names)


def alert_labels(client: Client) -> pd.DataFrame:
    """The labels of every (rule, series) that ever fired or resolved, as its newest notified transition has them
    (JSON objects of strings): what routes and silences match; with that transition's state (``to_state``) and
    when it was recorded (``known_at``, from which ``group_wait`` runs)."""
    result = client.query(
        "SELECT rule, series, argMax(labels, window_end) AS labels, argMax(to_state, window_end) AS to_state, "
        "argMax(recorded_at, window_end) AS known_at FROM alert_transitions FINAL WHERE notify = 1 "
        "GROUP BY rule, series")
    return pd.DataFrame(result.result_rows, columns=result.column_names)


def silences(client: Client, since: datetime) -> pd.DataFrame:
    """Silences that have not ended by ``since`` (active or pending then), newest first."""
    result = client.query(
        "SELECT silence_id, matchers, starts_at, ends_at, created_by, comment FROM alert_silences FINAL "
        "WHERE ends_at > {since:DateTime64(3)} ORDER BY starts_at DESC, silence_id",
        parameters={"since": since.replace(tzinfo=None)})
    return pd.DataFrame(result.result_rows, columns=result.column_names)


def group_notifications(client: Client, since: datetime, until: datetime) -> pd.DataFrame:
    """What receivers were sent in ``[since, until)`` (``alert_group_notifications``), newest first: when, to
    whom, which group, its status, how many alerts, and whether it was delivered yet (0 alerts: recorded, not sent,
    e.g. an all-clear to a receiver without ``send_resolved``)."""
    result = client.query(
        "SELECT decided_at, receiver, group_key, status, alerts, notification_key IN "
        "(SELECT transition_key FROM alert_notifications FINAL WHERE startsWith(channel, 'receiver:')) AS delivered "
        "FROM alert_group_notifications FINAL "
        "WHERE decided_at >= {lo:DateTime64(3)} AND decided_at < {hi:DateTime64(3)} ORDER BY decided_at DESC "
        "LIMIT 500", parameters={"lo": since.replace(tzinfo=None), "hi": until.replace(tzinfo=None)})
    return pd.DataFrame(result.result_rows, columns=result.column_names)


def failed_deliveries(client: Client, since: datetime, until: datetime) -> pd.DataFrame:
    """Alert notifications given up (``alert_delivery_failures``) in ``[since, until)``, newest first: the rule,
    series, channel, reason, attempts and when."""
    result = client.query(
        "SELECT failed_at, rule, series, to_state, channel, reason, attempts, last_status, window_end "
        "FROM alert_delivery_failures FINAL "
        "WHERE failed_at >= {lo:DateTime64(3)} AND failed_at < {hi:DateTime64(3)} ORDER BY failed_at DESC",
        parameters={"lo": since.replace(tzinfo=None), "hi": until.replace(tzinfo=None)})
    return pd.DataFrame(result.result_rows, columns=result.column_names)


def overview_resolution_s(lengths_ms: list[int], minutes: int) -> int:
    """About 60–150 points per chart: a whole multiple of the finest stored window length."""
    finest = max(1, (min(lengths_ms) if lengths_ms else 60_000) // 1000)
    target = max(finest, minutes * 60 // 120)
    return -(-target // finest) * finest


def _bucketed(client: Client, sql: str, since: datetime, until: datetime, resolution_s: int,
              **parameters: Any) -> pd.DataFrame:
    df = _frame(client, sql, since, until, r=resolution_s, **parameters)
    if not df.empty:
        # toStartOfInterval gives a DateTime, which Arrow carries as seconds since the epoch (UInt32).
        t = df["t"]
        df["t"] = pd.to_datetime(t, unit="s", utc=True) if pd.api.types.is_integer_dtype(t) else pd.to_datetime(
            t, utc=True)
    return df


def app_rates(client: Client, since: datetime, until: datetime, resolution_s: int,
              length_ms: int) -> pd.DataFrame:
    """Per app and bucket: events/s and error+critical log lines/s, from tumbling windows of ``length_ms``."""
    return _bucketed(client,
        "SELECT toStartOfInterval(window_start, toIntervalSecond({r:UInt32})) AS t, app, "
        "sum(event_count) / {r:UInt32} AS events_per_s, "
        "sum(level_error + level_critical) / {r:UInt32} AS errors_per_s "
        "FROM window_aggregates FINAL WHERE window_kind = 'tumbling' AND window_length_ms = {l:UInt64} "
        "AND window_start >= {lo:DateTime64(3)} AND window_start < {hi:DateTime64(3)} "
        "GROUP BY t, app ORDER BY t, app", since, until, resolution_s, l=length_ms)


def dropped_stragglers(client: Client, since: datetime, until: datetime, resolution_s: int) -> pd.DataFrame:
    """Per bucket of detection time and window kind: distinct events dropped as stragglers."""
    return _bucketed(client,
        "SELECT toStartOfInterval(detected_at, toIntervalSecond({r:UInt32})) AS t, window_kind, "
        "count(DISTINCT source_partition, source_offset) AS dropped FROM stragglers "
        "WHERE detected_at >= {lo:DateTime64(3)} AND detected_at < {hi:DateTime64(3)} "
        "GROUP BY t, window_kind ORDER BY t, window_kind", since, until, resolution_s)


def dead_letter_rate(client: Client, since: datetime, until: datetime, resolution_s: int) -> pd.DataFrame:
    """Per bucket of detection time: dead-lettered records per second."""
    return _bucketed(client,
        "SELECT toStartOfInterval(detected_at, toIntervalSecond({r:UInt32})) AS t, "
        "count() / {r:UInt32} AS per_s FROM dead_letters FINAL "
        "WHERE detected_at >= {lo:DateTime64(3)} AND detected_at < {hi:DateTime64(3)} GROUP BY t ORDER BY t",
        since, until, resolution_s)


def duplicates_per_app(client: Client, since: datetime, until: datetime) -> pd.DataFrame:
    """Per app and minute of arrival at the broker: records dropped as duplicates of an accepted event."""
    return _bucketed(client,
        "SELECT toStartOfInterval(kafka_timestamp, toIntervalSecond({r:UInt32})) AS t, app, count() AS duplicates "
        "FROM duplicates FINAL WHERE kafka_timestamp >= {lo:DateTime64(3)} AND kafka_timestamp < {hi:DateTime64(3)} "
        "GROUP BY t, app ORDER BY t, app", since, until, DUPLICATE_BUCKET_S)


def log_levels(client: Client, since: datetime, until: datetime, resolution_s: int, length_ms: int) -> pd.DataFrame:
    """Per bucket, app and level: log lines (from tumbling windows of ``length_ms``), long format."""
    df = _bucketed(client,
        "SELECT toStartOfInterval(window_start, toIntervalSecond({r:UInt32})) AS t, app, "
        "sum(level_debug) AS debug, sum(level_info) AS info, sum(level_warning) AS warning, "
        "sum(level_error) AS error, sum(level_critical) AS critical "
        "FROM window_aggregates FINAL WHERE window_kind = 'tumbling' AND kind = 'log' "
        "AND window_length_ms = {l:UInt64} "
        "AND window_start >= {lo:DateTime64(3)} AND window_start < {hi:DateTime64(3)} "
        "GROUP BY t, app ORDER BY t, app", since, until, resolution_s, l=length_ms)
    if df.empty:
        return df
    return df.melt(id_vars=["t", "app"], var_name="level", value_name="lines")


def error_burst_peaks(client: Client, since: datetime, until: datetime, resolution_s: int) -> pd.DataFrame:
    """Per bucket and app: the most error + critical lines any sliding window ending in the bucket held."""
    return _bucketed(client,
        "SELECT toStartOfInterval(window_end, toIntervalSecond({r:UInt32})) AS t, app, "
        "max(level_error + level_critical) AS peak, any(window_length_ms) / 1000 AS window_s "
        "FROM sliding_windows FINAL WHERE kind = 'log' "
        "AND window_end >= {lo:DateTime64(3)} AND window_end < {hi:DateTime64(3)} "
        "GROUP BY t, app ORDER BY t, app", since, until, resolution_s)


def sessions_per_app(client: Client, since: datetime, until: datetime, resolution_s: int) -> pd.DataFrame:
    """Per bucket of session end and app: sessions closed."""
    return _bucketed(client,
        "SELECT toStartOfInterval(session_end, toIntervalSecond({r:UInt32})) AS t, app, count() AS sessions "
        "FROM sessions FINAL WHERE session_end >= {lo:DateTime64(3)} AND session_end < {hi:DateTime64(3)} "
        "GROUP BY t, app ORDER BY t, app", since, until, resolution_s)


def session_shapes(client: Client, since: datetime, until: datetime, limit: int = DISTRIBUTION_ROWS) -> pd.DataFrame:
    """Duration (s) and events of sessions that ended in the range (the newest ``limit``), for distributions."""
    return _frame(client,
        "SELECT app, duration_ms / 1000 AS duration_s, event_count FROM sessions FINAL "
        "WHERE session_end >= {lo:DateTime64(3)} AND session_end < {hi:DateTime64(3)} "
        "ORDER BY session_end DESC LIMIT {n:UInt32}", since, until, n=limit)


def active_sessions(client: Client, since: datetime, until: datetime, resolution_s: int) -> pd.DataFrame:
    """Per bucket and app: sessions active in the bucket, closed or still open. A session is active from its first
    to its last event (so far), and counts once in every bucket that span touches within the range."""
    spans = ("SELECT app, session_start, last_event_time FROM {table}{final} WHERE last_event_time >= "
             "{{lo:DateTime64(3)}} AND session_start < {{hi:DateTime64(3)}}")
    return _bucketed(client,
        "SELECT toDateTime(b * {r:UInt32}) AS t, app, count() AS sessions FROM (SELECT app, arrayJoin(range("
        "intDiv(greatest(toUnixTimestamp(session_start), toUnixTimestamp({lo:DateTime64(3)})), {r:UInt32}), "
        "intDiv(least(toUnixTimestamp(last_event_time), toUnixTimestamp({hi:DateTime64(3)}) - 1), {r:UInt32}) + 1"
        ")) AS b FROM (" + spans.format(table="sessions", final=" FINAL") + " UNION ALL "
        + spans.format(table="open_sessions_now", final="") + ")) GROUP BY t, app ORDER BY t, app",
        since, until, resolution_s)


def open_sessions_per_app(client: Client) -> pd.DataFrame:
    """Per app: sessions open now (the job's latest batch) and the events they hold so far."""
    return _arrow_frame(client,
        "SELECT app, count() AS open_sessions, sum(event_count) AS events FROM open_sessions_now "
        "GROUP BY app ORDER BY app")


def newest_open_sessions(client: Client, limit: int = OPEN_SESSION_ROWS) -> pd.DataFrame:
    """The open sessions with the latest events (at most ``limit``), as they stand so far."""
    return _arrow_frame(client,
        "SELECT app, key_kind, session_key, session_start AS started, last_event_time AS last_event, "
        "duration_ms / 1000 AS duration_s, event_count AS events, log_count AS log_lines FROM open_sessions_now "
        "ORDER BY last_event_time DESC, app, session_key LIMIT {n:UInt32}",
        n=limit)


def _frame(client: Client, sql: str, since: datetime, until: datetime, **parameters: Any) -> pd.DataFrame:
    """The result of ``sql`` over ``[since, until)`` (``{lo}``, ``{hi}``) as a DataFrame, read as Arrow columns.

    Read as Arrow: building the frame from Python row tuples cost several times as much for a histogram's 100,000
    rows (docs/performance.md#one-store-server-dashboard-queries).
    ``DateTime64`` columns are given back naive (UTC), as the row API gives them, so tables show them as before;
    Arrow carries a plain ``DateTime`` as seconds since the epoch (UInt32), see :func:`_bucketed`.
    """
    return _arrow_frame(client, sql, lo=since.replace(tzinfo=None), hi=until.replace(tzinfo=None), **parameters)


def _arrow_frame(client: Client, sql: str, **parameters: Any) -> pd.DataFrame:
    """:func:`_frame` of a query without a range."""
    df = client.query_arrow(sql, parameters=parameters).to_pandas()
    for column in df.columns:
        if isinstance(df[column].dtype, pd.DatetimeTZDtype):
            df[column] = df[column].dt.tz_convert(None)
    return df


def straggler_lateness(client: Client, since: datetime, until: datetime,
                       limit: int = DISTRIBUTION_ROWS) -> pd.DataFrame:
    """Lateness (watermark − corrected event time, s) of dropped contributions detected in the range."""
    return _frame(client,
        "SELECT window_kind, lateness_ms / 1000 AS lateness_s FROM stragglers "
        "WHERE detected_at >= {lo:DateTime64(3)} AND detected_at < {hi:DateTime64(3)} "
        "ORDER BY detected_at DESC LIMIT {n:UInt32}", since, until, n=limit)


def straggler_windows(client: Client, since: datetime, until: datetime, top: int = 20) -> pd.DataFrame:
    """The windows that lost the most events to the watermark (detected in the range)."""
    return _frame(client,
        "SELECT window_kind, app, name, window_start, window_end, "
        "count(DISTINCT source_partition, source_offset) AS dropped, max(lateness_ms) / 1000 AS max_lateness_s "
        "FROM stragglers WHERE detected_at >= {lo:DateTime64(3)} AND detected_at < {hi:DateTime64(3)} "
        "GROUP BY window_kind, window_length_ms, window_hop_ms, app, name, series_tags, window_start, window_end "
        "ORDER BY dropped DESC, window_end DESC LIMIT {n:UInt32}", since, until, n=top)


def device_clock_offsets(client: Client, since: datetime, until: datetime) -> pd.DataFrame:
    """Per device seen in the range: its latest clock offset (received − sent, s; positive = clock behind).

    Read from ``device_clocks_per_minute`` (each device's newest offset per minute, sql/0008) rather than from the
    1.7M ``device_clocks`` rows a day of 100 devices leaves (a scan that grows with the history kept;
    docs/performance.md#one-store-server-dashboard-queries), with the same answer as ``argMax`` over
    those rows. A minute's row (or each unmerged part of it) is the newest of a set of rows: when it lies in the
    range, no other row of the set in the range is newer; when it is older than the range, none of them is in it.
    Only a set with a row at or after ``until`` (the range ends inside its minute) is unknown: those devices' rows
    of that minute are read from ``device_clocks`` (none when the range ends now). No ``FINAL``: a replayed batch
    writes identical rows, so ``argMax`` is the same."""
    return _frame(client,
        "SELECT app, device, argMax(offset_ms, at) / 1000 AS offset_s FROM ("
        " SELECT app, device, finalizeAggregation(newest_offset) AS offset_ms, newest_received AS at"
        " FROM device_clocks_per_minute"
        " WHERE minute >= toStartOfMinute({lo:DateTime64(3)}) AND minute <= toStartOfMinute({hi:DateTime64(3)})"
        " AND newest_received >= {lo:DateTime64(3)} AND newest_received < {hi:DateTime64(3)}"
        " UNION ALL"
        " SELECT app, device, offset_avg_ms AS offset_ms, last_received AS at FROM device_clocks"
        " WHERE (app, device) IN (SELECT app, device FROM device_clocks_per_minute"
        "  WHERE minute = toStartOfMinute({hi:DateTime64(3)}) AND newest_received >= {hi:DateTime64(3)})"
        " AND last_received >= greatest({lo:DateTime64(3)}, toStartOfMinute({hi:DateTime64(3)}))"
        " AND last_received < {hi:DateTime64(3)}"
        ") GROUP BY app, device ORDER BY abs(offset_s) DESC", since, until)


def _series_filter() -> str:
    return "app = {app:String} AND kind = {kind:String} AND name = {name:String} AND series_tags = {tags:String}"


def _series_params(series: SeriesKey) -> dict[str, Any]:
    return {"app": series.app, "kind": series.kind, "name": series.name, "tags": series.series_tags}


def hopping_windows(client: Client, series: SeriesKey, length_ms: int, hop_ms: int, since: datetime,
                    until: datetime) -> pd.DataFrame:
    """Each hopping window's own aggregates (newest version), by window start."""
    return _frame(client,
        f"SELECT window_start, event_count, rate, p50, p90, p99, distinct_users, {_LEVEL_COLUMNS} "
        "FROM window_aggregates FINAL "
        f"WHERE window_kind = 'hopping' AND window_length_ms = {{l:UInt64}} AND window_hop_ms = {{h:UInt64}} "
        f"AND {_series_filter()} AND window_start >= {{lo:DateTime64(3)}} AND window_start < {{hi:DateTime64(3)}} "
        "ORDER BY window_start", since, until, l=length_ms, h=hop_ms, **_series_params(series))


def sliding_windows(client: Client, series: SeriesKey, since: datetime, until: datetime,
                    limit: int = 5_000) -> pd.DataFrame:
    """The trailing window of each event of the series (newest ``limit``), by window end."""
    df = _frame(client,
        "SELECT window_end, event_count, rate, mean, max, level_error + level_critical AS errors, "
        "window_length_ms / 1000 AS window_s FROM sliding_windows FINAL "
        f"WHERE {_series_filter()} AND window_end >= {{lo:DateTime64(3)}} AND window_end < {{hi:DateTime64(3)}} "
        "ORDER BY window_end DESC LIMIT {n:UInt32}", since, until, n=limit, **_series_params(series))
    return df.iloc[::-1].reset_index(drop=True)


def corrections_published(client: Client, since: datetime, until: datetime, resolution_s: int) -> pd.DataFrame:
    """Per bucket of detection time and window kind: windows re-published with late events, and those events."""
    return _bucketed(client,
        "SELECT toStartOfInterval(detected_at, toIntervalSecond({r:UInt32})) AS t, window_kind, "
        "count() AS windows, sum(late_events) AS late_events FROM corrections FINAL "
        "WHERE detected_at >= {lo:DateTime64(3)} AND detected_at < {hi:DateTime64(3)} "
        "GROUP BY t, window_kind ORDER BY t, window_kind", since, until, resolution_s)
