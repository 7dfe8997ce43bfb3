"""A chart is built once per content: the same data drawn again gives the same figure, any changed value a new one."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pandas as pd
import plotly.graph_objects as go

from dashboard import common
from dashboard.figure_cache import content_key, reused

T0 = datetime(2026, 11, 28, 12, 0, tzinfo=UTC)
SPAN = (T0, T0 + timedelta(minutes=30))


def rates(*values: float) -> pd.DataFrame:
    return pd.DataFrame({"t": [T0 + timedelta(seconds=10 * i) for i in range(len(values))],
                         "app": ["shop"] * len(values), "events_per_s": list(values)})


def test_equal_frames_have_one_key_and_any_changed_value_or_order_another():
    assert content_key(rates(1, 2, 3)) == content_key(rates(1, 2, 3))
    assert content_key(rates(1, 2, 3)) != content_key(rates(1, 2, 4))
    assert content_key(rates(1, 2, 3)) != content_key(rates(1, 2, 3).iloc[::-1])
    assert content_key(rates(1, 2, 3)) != content_key(rates(1, 2, 3).rename(columns={"app": "device"}))


def test_the_same_data_drawn_again_is_the_same_figure():
    first = common.time_chart(rates(1, 2, 3), "events_per_s", "Events/s", "events / s", SPAN, "app")
    again = common.time_chart(rates(1, 2, 3), "events_per_s", "Events/s", "events / s", SPAN, "app")
    assert again is first


def test_new_data_another_range_or_title_is_a_new_figure():
    first = common.time_chart(rates(1, 2, 3), "events_per_s", "Events/s", "events / s", SPAN, "app")
    later = (SPAN[0] + timedelta(seconds=5), SPAN[1] + timedelta(seconds=5))
    assert common.time_chart(rates(1, 2, 5), "events_per_s", "Events/s", "events / s", SPAN, "app") is not first
    assert common.time_chart(rates(1, 2, 3), "events_per_s", "Events/s", "events / s", later, "app") is not first
    assert common.time_chart(rates(1, 2, 3), "events_per_s", "Rate", "events / s", SPAN, "app") is not first
    newest = common.time_chart(rates(1, 2, 3), "events_per_s", "Events/s", "events / s", SPAN, "app",
                               colours={"shop": "#d62728"})
    assert newest is not first and newest.data[0].line.color == "#d62728"


def test_arguments_it_cannot_key_build_every_time():
    built = []

    @reused
    def chart(points: set[int]) -> go.Figure:
        built.append(points)
        return go.Figure()

    chart({1, 2})
    chart({1, 2})
    assert len(built) == 2
