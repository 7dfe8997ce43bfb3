"""The statement guard as the server applies it: every statement checked by ``store.server.guard`` before chDB runs
it, each verdict remembered per statement and role."""

from __future__ import annotations

import collections
import threading

from store.server.engine import Engine
from store.server.errors import StoreError
from store.server.guard import Refused, Verdict, check
from store.server.limits import READER, Limits

VERDICTS_KEPT = 1024
"""Admitted statements whose verdict is remembered (the job and the dashboard send the same texts again and again;
a verdict depends only on the text and the role). Only statements up to ``VERDICT_TEXT_MAX`` bytes are kept."""
VERDICT_TEXT_MAX = 8192
_verdicts: collections.OrderedDict[tuple[str, str], Verdict] = collections.OrderedDict()
_verdicts_lock = threading.Lock()


def remembered(statement: str, role: str, read_only: bool) -> Verdict | None:
    """The verdict already given to this statement and role, if it is remembered."""
    key = (statement, READER if read_only else role)
    with _verdicts_lock:
        verdict = _verdicts.get(key)
        if verdict is not None:
            _verdicts.move_to_end(key)
        return verdict


def guard(statement: str, role: str, read_only: bool, limits: Limits, engine: Engine) -> Verdict:
    """The one place every statement is checked before chDB runs it (``store.server.guard``, from ClickHouse's own
    parser): a refused statement raises a :class:`StoreError` with the guard's code, name and message."""
    role = READER if read_only else role
    key = (statement, role)
    with _verdicts_lock:
        verdict = _verdicts.get(key)
        if verdict is not None:
            _verdicts.move_to_end(key)
            return verdict
    try:
        verdict = check(statement, role=role, parse=engine.parse,  # type: ignore[arg-type]
                                  caps=limits.caps, max_query_size=limits.max_query_size)
    except Refused as exc:
        raise StoreError.of(exc.code, exc.name, exc.message, exc.http_status) from None
    if len(statement) <= VERDICT_TEXT_MAX:
        with _verdicts_lock:
            _verdicts[key] = verdict
            if len(_verdicts) > VERDICTS_KEPT:
                _verdicts.popitem(last=False)
    return verdict
