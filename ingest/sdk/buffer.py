"""The bounded in-memory buffer between the application's calls and the SDK's background sender.

The application thread only ever appends here (the hot path); the sender takes whole batches. While there is
room, ``put`` is a bare ``deque.append`` (atomic under the GIL, no lock: this is what keeps a call near a
microsecond). Only a full buffer takes the lock, and there the overflow policy decides; every event it drops is
counted under that lock, so the counters are exact whatever the threads do.

The SDK's own health events wait in a separate queue: the overflow policy never evicts them, so every drop it
counts is an application's event. Accounting identity, exact whenever read under the lock (:meth:`counts`):
``accepted = taken + pending + dropped_oldest`` (application events only).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Any, Literal

OverflowPolicy = Literal["block", "drop_oldest", "drop_newest"]
OVERFLOW_POLICIES: tuple[OverflowPolicy, ...] = ("block", "drop_oldest", "drop_newest")
_BLOCK_RECHECK_S = 0.005


class EventBuffer:
    """A bounded FIFO of pending events with an overflow policy.

    ``put`` never raises for a full buffer: ``block`` waits for the sender to make room (backpressure),
    ``drop_oldest`` evicts the oldest pending event, ``drop_newest`` refuses the new one. Threads racing past the
    room check may overshoot ``capacity`` by at most one event each.
    """

    def __init__(self, capacity: int, policy: OverflowPolicy) -> None:
        if policy not in OVERFLOW_POLICIES:
            raise ValueError(f"overflow policy must be one of {', '.join(OVERFLOW_POLICIES)}, not {policy!r}")
        self.capacity = capacity
        self.policy = policy
        # Never replaced (instruments hold it, see ``items``): after fork it is emptied in place, which is safe
        # because the child has a single thread.
        self._items: deque[Any] = deque()
        self._internal: deque[Any] = deque()
        self._reset()

    def _reset(self) -> None:
        self._items.clear()
        self._internal.clear()
        self._lock = threading.Lock()
        self._room = threading.Condition(self._lock)
        self.taken = 0
        self.dropped_oldest = 0
        self.dropped_newest = 0
        self.blocked_puts = 0
        """Calls that had to wait for room under the ``block`` policy."""

    def reset_after_fork(self) -> None:
        """In a forked child: start empty (the parent sends what it buffered), with fresh locks."""
        self._reset()

    def put(self, item: Any) -> bool:
        """Append ``item``; returns False if the ``drop_newest`` policy refused it."""
        items = self._items
        if len(items) < self.capacity:
            items.append(item)
            return True
        return self.put_full(item)

    @property
    def items(self) -> deque[Any]:
        """The underlying deque, for callers that inline ``put``'s fast path (append while ``len < capacity``,
        else :meth:`put_full`)."""
        return self._items

    def put_full(self, item: Any) -> bool:
        """``put`` when the buffer looked full: applies the overflow policy under the lock."""
        with self._lock:
            items = self._items
            if len(items) >= self.capacity:
                if self.policy == "drop_newest":
                    self.dropped_newest += 1
                    return False
                if self.policy == "drop_oldest":
                    items.popleft()
                    self.dropped_oldest += 1
                else:
                    self.blocked_puts += 1
                    while len(items) >= self.capacity:
                        # A timed wait: the sender's notify can slip between our check and this wait.
                        self._room.wait(_BLOCK_RECHECK_S)
            items.append(item)
            return True

    def put_unbounded(self, item: Any) -> None:
        """Queue one of the SDK's own health events: outside the overflow policy and the accepted count."""
        with self._lock:
            self._internal.append(item)

    def take(self, max_items: int) -> list[Any]:
        """Remove and return every pending health event and up to ``max_items`` oldest application events."""
        if not self._items and not self._internal:
            return []
        with self._lock:
            internal = self._internal
            batch = [internal.popleft() for _ in range(len(internal))]
            items = self._items
            n = min(len(items), max_items)
            popleft = items.popleft
            batch += [popleft() for _ in range(n)]
            self.taken += n
            self._room.notify_all()
            return batch

    def counts(self) -> tuple[int, int]:
        """(accepted, queue depth) of application events, read consistently."""
        with self._lock:
            depth = len(self._items)
            return self.taken + depth + self.dropped_oldest, depth

    def __len__(self) -> int:
        return len(self._items) + len(self._internal)

    def wait_empty(self, deadline: float) -> bool:
        """Poll until the buffer is empty or ``time.monotonic()`` passes ``deadline``."""
        while self._items or self._internal:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.001)
        return True
