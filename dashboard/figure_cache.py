"""Charts built once per content: a refreshing page part that draws the same data again gets the same figure back.

Between two batches of the query it follows, a refreshing part draws its last read again (``dashboard.live``).
Building a Plotly Express figure takes ~0.1 s of CPU (a time chart of 900 points), so rebuilding a page's charts at
every refresh cost the dashboard server more than reading them; a figure keyed by its inputs' content takes ~1 ms
to find. The figures are shared by every session: never change one these functions return (pass what it needs
as an argument instead).
"""

from __future__ import annotations

import functools
import hashlib
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import ParamSpec

import pandas as pd
import plotly.graph_objects as go

P = ParamSpec("P")

CACHED_FIGURES = 128
"""Figures kept (least recently used dropped first): a few pages' charts for a few open sessions."""

_figures: OrderedDict[Hashable, go.Figure] = OrderedDict()
_lock = threading.Lock()


def content_key(value: object) -> Hashable:
    """A hashable stand-in for ``value`` that is equal exactly when the content is: a DataFrame by its columns,
    types and every value in order. Raises ``TypeError`` for what it cannot key (the figure is then built)."""
    if isinstance(value, pd.DataFrame):
        rows = pd.util.hash_pandas_object(value, index=True).to_numpy().tobytes()
        return ("frame", tuple(value.columns), tuple(map(str, value.dtypes)), hashlib.blake2b(rows).digest())
    if isinstance(value, pd.Series):
        return ("series", value.name, str(value.dtype), content_key(value.to_frame()))
    if isinstance(value, list | tuple):
        return (type(value).__name__, *map(content_key, value))
    if isinstance(value, dict):
        return ("dict", *((k, content_key(v)) for k, v in value.items()))
    hash(value)
    return value


def reused(build: Callable[P, go.Figure]) -> Callable[P, go.Figure]:
    """Decorator: ``build``'s figure for these arguments' content, built only the first time."""
    @functools.wraps(build)
    def figure(*args: P.args, **kwargs: P.kwargs) -> go.Figure:
        try:
            key = (build.__module__, build.__qualname__, content_key(args), content_key(kwargs))
        except TypeError:
            return build(*args, **kwargs)
        with _lock:
            if (found := _figures.get(key)) is not None:
                _figures.move_to_end(key)
                return found
        built = build(*args, **kwargs)
        with _lock:
            _figures[key] = built
            while len(_figures) > CACHED_FIGURES:
                _figures.popitem(last=False)
        return built
    return figure
