"""The gateway's rate limits: a token bucket per bearer token, and the 429 a request over it gets."""

from __future__ import annotations

import math
import time
from typing import Any

from eventide.config import GatewayToken
from ingest.gateway.wire import Problem, RequestProblem


class TokenBucket:
    """``rate`` events per second on average, at most ``size`` at once: a request takes as many units as it has
    events, all of them or none. Used from the event loop only (no lock: nothing awaits between look and take)."""

    def __init__(self, rate: float, size: int, clock: Any = time.monotonic) -> None:
        self.rate, self.size, self._clock = rate, size, clock
        self._level = float(size)
        self._stamp = clock()

    def _refill(self) -> float:
        now = self._clock()
        self._level = min(float(self.size), self._level + (now - self._stamp) * self.rate)
        self._stamp = now
        return self._level

    def wait_s(self, events: int) -> float:
        """Seconds until ``events`` could be taken (0: now); nothing is taken."""
        return max(0.0, (events - self._refill()) / self.rate)

    def take(self, events: int) -> float:
        """Take ``events`` and return 0, or take nothing and return the seconds until they could be taken."""
        wait = self.wait_s(events)
        if wait == 0:
            self._level -= events
        return wait

    def give_back(self, events: int) -> None:
        """Return units taken for a batch that was not written (Kafka unavailable)."""
        self._level = min(float(self.size), self._refill() + events)


def rate_limited(token: GatewayToken, wait_s: float, events: int | None) -> RequestProblem:
    """The 429 for ``token``: ``events`` of a batch (None: the next request) can be taken in ``wait_s``."""
    what = f"{events} events need" if events is not None else "the next request needs"
    retry = max(1, math.ceil(wait_s))
    return RequestProblem(429, Problem(
        error="rate_limited", detail=f"this token may send {token.rate:g} events/s (burst {token.bucket_size}): "
                                     f"{what} {wait_s:.2f}s more; nothing written"),
        headers={"Retry-After": str(retry)})
