"""What a page shows where it has nothing: a table cell reads "—" (never None, nan or an empty box), a chart with
nothing to draw says why in its middle."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from dashboard import common


def test_missing_values_and_empty_texts_show_a_dash_and_the_rest_is_kept():
    when = datetime(2026, 11, 29, 6, 0, 1)
    table = pd.DataFrame({"rule": ["p99", "errors"], "value": [92.5, np.nan], "since": [when, pd.NaT],
                          "silenced": ["", "s-1"], "count": [3, 4], "logs": ["/logs?app=a", None]})
    shown = common.shown(table, links=["logs"])
    assert shown["value"].tolist() == ["92.5", "—"]
    assert shown["since"].tolist() == ["2026-11-29 06:00:01", "—"]
    assert shown["silenced"].tolist() == ["—", "s-1"]
    assert shown["logs"].tolist() == ["/logs?app=a", ""]          # a link cell without a link draws nothing
    assert shown["rule"].tolist() == ["p99", "errors"] and shown["count"].tolist() == [3, 4]
    assert table["value"].isna().sum() == 1                          # the page's own frame is left as it was


def test_a_table_without_missing_values_is_shown_as_it_is():
    table = pd.DataFrame({"rule": ["p99"], "value": [1.0]})
    assert common.shown(table) is table


def test_a_chart_with_nothing_to_draw_says_why_and_one_with_values_does_not():
    since = datetime(2026, 11, 29, 6, 0, tzinfo=UTC)
    span = (since, since + timedelta(minutes=5))
    nothing = pd.DataFrame({"t": [since, since + timedelta(minutes=1)], "p99": [None, None]})
    something = nothing.assign(p99=[None, 4.0])
    [note] = json.loads(common.time_chart(nothing, "p99", "p99", "ms", span).to_json())["layout"]["annotations"]
    assert note["text"] == common.NOTHING_TO_DRAW
    assert "annotations" not in json.loads(common.time_chart(something, "p99", "p99", "ms", span).to_json())["layout"]
    fig = common.chart_layout(go.Figure(go.Scatter(x=[1, 2], y=[np.nan, None])), empty="No values: counts only")
    assert [a["text"] for a in json.loads(fig.to_json())["layout"]["annotations"]] == ["No values: counts only"]
