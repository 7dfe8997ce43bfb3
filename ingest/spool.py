"""The SDK's offline spool: a bounded on-disk queue of events that could not reach Kafka.

Layout: one directory per (app, device) holding segment files named ``<unix ms>-<pid>-<seq>.spool``, so sorting
the names gives the order they were written in. Each line is one spooled record. A segment is written by one
process only, which holds an exclusive ``flock`` on it while it is open; a reader replays a segment only if it
can take that lock, so segments of a live process (a forked worker, say) are never read half-written, and the
segments of a killed process are replayed by whichever process opens the spool next.

Progress through a segment is kept in ``<segment>.pos`` (byte offset, replaced atomically) once Kafka has
acknowledged a chunk, and the segment is deleted when fully replayed. A process killed in the middle of a
replay chunk sends that chunk again after restart: the event ids make such duplicates recognisable.
"""

from __future__ import annotations

import fcntl
import os
import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path

SEGMENT_SUFFIX = ".spool"
POSITION_SUFFIX = ".pos"


def spool_directory(root: Path, app: str, device: str) -> Path:
    """The spool of one (app, device); names are made filesystem-safe but stay recognisable."""
    def safe(part: str) -> str:
        return re.sub(r"[^A-Za-z0-9._-]", "_", part)[:100] or "_"
    return root / safe(app) / safe(device)


@dataclass
class SpoolChunk:
    """Lines read from one segment; ``commit`` it once Kafka acknowledged all of them."""

    segment: Path
    lines: list[bytes]
    end_offset: int
    reaches_end: bool


class Spool:
    """Append lines at the tail; read and commit chunks at the head. Thread-safe within one process."""

    def __init__(self, directory: Path, max_bytes: int, segment_bytes: int) -> None:
        self.directory = directory
        self.max_bytes = max_bytes
        self.segment_bytes = segment_bytes
        self.directory.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._writer: tuple[Path, int] | None = None      # (segment, fd) this process appends to
        self._writer_size = 0
        self._readers: dict[Path, int] = {}                # segments this process holds for replay
        self._seq = 0
        self.dropped_full = 0
        """Lines refused because the spool reached ``max_bytes``."""
        self.corrupt_lines = 0
        """Torn last lines of segments whose writer was killed mid-write."""
        self.size_bytes = self._pending_bytes()

    # Tail ------------------------------------------------------------------------------------------------
    def append(self, lines: list[bytes]) -> int:
        """Append lines (without newlines) in order; returns how many fit (the rest are dropped and counted)."""
        with self._lock:
            room = self.max_bytes - self.size_bytes
            data = bytearray()
            kept = 0
            for line in lines:
                if len(data) + len(line) + 1 > room:
                    break
                data += line
                data += b"\n"
                kept += 1
            self.dropped_full += len(lines) - kept
            if data:
                fd = self._writer_fd()
                os.write(fd, data)        # one write per batch: a kill leaves at most one torn line
                self._writer_size += len(data)
                self.size_bytes += len(data)
                if self._writer_size >= self.segment_bytes:
                    self._close_writer()
            return kept

    def _writer_fd(self) -> int:
        if self._writer is None:
            self._seq += 1
            path = self.directory / f"{time.time_ns() // 1_000_000:013d}-{os.getpid()}-{self._seq:06d}{SEGMENT_SUFFIX}"
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            fcntl.flock(fd, fcntl.LOCK_EX)
            self._writer = (path, fd)
            self._writer_size = 0
        return self._writer[1]

    def _close_writer(self) -> None:
        if self._writer is not None:
            os.fsync(self._writer[1])
            os.close(self._writer[1])     # releases the flock: the segment is now complete and replayable
            self._writer = None

    # Head ------------------------------------------------------------------------------------------------
    def segments(self) -> list[Path]:
        return sorted(self.directory.glob(f"*{SEGMENT_SUFFIX}"))

    def is_empty(self) -> bool:
        return not self.segments()

    def read(self, max_lines: int) -> SpoolChunk | None:
        """The next unacknowledged lines of the oldest segment this process may replay, or None."""
        with self._lock:
            for segment in self.segments():
                if self._writer is not None and segment == self._writer[0]:
                    self._close_writer()      # replay what we wrote so far; later appends start a new segment
                fd = self._readers.get(segment) or self._lock_for_reading(segment)
                if fd is None:
                    continue
                start = _read_position(segment)
                size = os.fstat(fd).st_size
                data = os.pread(fd, min(size - start, max_lines * 4096 + 65536), start)
                lines = data.split(b"\n")
                complete, torn = lines[:-1][:max_lines], lines[-1]
                end = start + sum(len(line) + 1 for line in complete)
                if not complete and torn and start + len(torn) >= size:
                    # Only a torn last line is left: its writer died mid-write, so it can never complete.
                    self.corrupt_lines += 1
                    self.size_bytes -= len(torn)
                    return SpoolChunk(segment, [], size, True)
                return SpoolChunk(segment, complete, end, end >= size)
            return None

    def _lock_for_reading(self, segment: Path) -> int | None:
        try:
            fd = os.open(segment, os.O_RDONLY)
        except FileNotFoundError:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:       # another live process is writing or replaying it
            os.close(fd)
            return None
        if not segment.exists():      # replayed and deleted by someone else between glob and lock
            os.close(fd)
            return None
        self._readers[segment] = fd
        return fd

    def commit(self, chunk: SpoolChunk) -> None:
        """Kafka acknowledged every line of ``chunk``: advance past it (delete the segment at its end)."""
        with self._lock:
            self.size_bytes -= sum(len(line) + 1 for line in chunk.lines)
            self.size_bytes = max(self.size_bytes, 0)
            position = chunk.segment.with_name(chunk.segment.name + POSITION_SUFFIX)
            if chunk.reaches_end:
                chunk.segment.unlink(missing_ok=True)
                position.unlink(missing_ok=True)
                fd = self._readers.pop(chunk.segment, None)
                if fd is not None:
                    os.close(fd)
            else:
                tmp = position.with_name(position.name + ".tmp")
                tmp.write_text(str(chunk.end_offset))
                os.replace(tmp, position)

    def close(self) -> None:
        with self._lock:
            self._close_writer()
            for fd in self._readers.values():
                os.close(fd)
            self._readers.clear()

    def forget_after_fork(self) -> None:
        """In a forked child: drop the parent's descriptors without touching them (the parent keeps its locks)."""
        self._writer = None
        self._readers = {}
        self._lock = threading.Lock()

    def _pending_bytes(self) -> int:
        total = 0
        for segment in self.segments():
            try:
                total += segment.stat().st_size - _read_position(segment)
            except FileNotFoundError:
                continue
        return total


def _read_position(segment: Path) -> int:
    try:
        return int(segment.with_name(segment.name + POSITION_SUFFIX).read_text())
    except (FileNotFoundError, ValueError):
        return 0
