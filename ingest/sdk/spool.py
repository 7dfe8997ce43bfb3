"""The SDK's offline spool: a bounded on-disk queue of events that could not reach Kafka.

Layout: one directory per (app, device) holding segment files named ``<unix ms>-<pid>-<seq>.spool``, so sorting
the names gives the order they were written in. Each line is one spooled record. A segment is written by one
process only, which holds an exclusive ``flock`` on it while it is open; a reader replays a segment only if it
can take that lock, so segments of a live process (a forked worker, say) are never read half-written, and the
segments of a killed process are replayed by whichever process opens the spool next.

Progress through a segment is kept in ``<segment>.pos`` (byte offset, replaced atomically) once Kafka has
acknowledged a chunk, and the segment is deleted when fully replayed. A process killed in the middle of a
replay chunk sends that chunk again after restart: the event ids make such duplicates recognisable.

Durability. An append lands whole or not at all: a write the disk refuses (``ENOSPC``, ``EDQUOT``, ``EFBIG``) or
cuts short is taken back (the segment truncated to where the append started) and its events counted as dropped;
nothing raises into the sender. A segment is fsynced when it is rolled or closed, and the directory whenever a
segment is created or removed, so a power loss keeps every closed segment. A crash can still leave a torn or
damaged line (in the open segment, between syncs); replay skips such lines, counts them and sends the rest.
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from eventide.durable import sync_directory

SEGMENT_SUFFIX = ".spool"
POSITION_SUFFIX = ".pos"

log = logging.getLogger("ingest.sdk.spool")

# The disk, a quota or the file-size limit refused the write: the spool is full, whatever its own bound says.
_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})


def safe_name(part: str) -> str:
    """``part`` as one path component below the spool root: recognisable, never a separator, never empty, and
    never ``.`` or ``..`` (an app or device named so would otherwise be the root itself or leave it); those two
    are spelled with ``%2E``, a character no other name keeps, so they take no other name's directory."""
    name = re.sub(r"[^A-Za-z0-9._-]", "_", part)[:100] or "_"
    return name.replace(".", "%2E") if name in (".", "..") else name


def spool_directory(root: Path, app: str, device: str) -> Path:
    """The spool of one (app, device); names are made filesystem-safe but stay recognisable."""
    return root / safe_name(app) / safe_name(device)


@dataclass
class SpoolChunk:
    """Lines read from one segment; ``commit`` it once Kafka acknowledged all of them."""

    segment: Path
    lines: list[bytes]
    end_offset: int
    reaches_end: bool
    skipped: int = 0
    """Torn or damaged lines between the start and ``end_offset``, left out of ``lines``."""
    skipped_bytes: int = 0


class Spool:
    """Append lines at the tail; read and commit chunks at the head. Thread-safe within one process."""

    def __init__(self, directory: Path, max_bytes: int, segment_bytes: int) -> None:
        self.directory = directory
        self.max_bytes = max_bytes
        self.segment_bytes = segment_bytes
        self._lock = threading.Lock()
        self._writer: tuple[Path, int] | None = None      # (segment, fd) this process appends to
        self._writer_size = 0
        self._readers: dict[Path, int] = {}                # segments this process holds for replay
        self._positions: dict[Path, int] = {}              # replay progress in held segments (the .pos may fail)
        self._seq = 0
        self._failing = False                              # the last append failed (log once per run of failures)
        self.dropped_full = 0
        """Lines refused because the spool reached ``max_bytes``, or the disk (file system full, quota, file-size
        limit) refused the write."""
        self.dropped_error = 0
        """Lines refused because writing them failed for another reason (an I/O error, a read-only file system)."""
        self.torn_lines = 0
        """Torn or damaged lines skipped on replay: left by a process killed mid-write or by a power loss."""
        try:
            self._make_directory()
        except OSError as e:      # a full or read-only disk must not stop the app: appends count their drops
            log.warning("eventide spool directory %s cannot be created (%s); events that go offline are dropped "
                        "and counted until it can", directory, e)
        self.size_bytes = self._pending_bytes()

    # Tail ------------------------------------------------------------------------------------------------
    def append(self, lines: list[bytes]) -> int:
        """Append lines (without newlines) in order; returns how many were written (the rest are dropped and
        counted). Never raises for a failed write: the lines land whole or not at all."""
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
            if not data:
                return kept
            try:
                fd = self._writer_fd()
            except OSError as e:
                self._count_failure(e, kept)
                return 0
            start = self._writer_size
            written = 0
            try:
                with memoryview(data) as view:
                    while written < len(data):    # one write per batch: a kill leaves at most one torn line
                        n = os.write(fd, view[written:])
                        if n <= 0:
                            raise OSError(errno.ENOSPC, "no progress writing the spool")
                        written += n
            except OSError as e:
                self._take_back(fd, start, written)
                self._count_failure(e, kept)
                return 0
            if self._failing:
                log.warning("eventide spool %s writable again", self.directory)
                self._failing = False
            self._writer_size += len(data)
            self.size_bytes += len(data)
            if self._writer_size >= self.segment_bytes:
                self._close_writer()
            return kept

    def _take_back(self, fd: int, start: int, written: int) -> None:
        """Truncate the open segment to where the failed append started: no torn line is left behind."""
        try:
            os.ftruncate(fd, start)
        except OSError as e:
            # The partial line stays: close the segment so nothing is appended after it. Replay skips and
            # counts it as torn (its bytes are pending until then).
            log.error("eventide spool %s: cannot take back a failed write (%s); its torn line will be skipped",
                      self.directory, e)
            self._writer_size += written
            self.size_bytes += written
            self._close_writer()

    def _count_failure(self, error: OSError, lines: int) -> None:
        if error.errno in _FULL_ERRNOS:
            self.dropped_full += lines
        else:
            self.dropped_error += lines
        if not self._failing:
            self._failing = True
            log.warning("eventide spool %s cannot be written (%s): offline events are dropped and counted until "
                        "it can", self.directory, error)

    def _writer_fd(self) -> int:
        if self._writer is None:
            self._seq += 1
            path = self.directory / f"{time.time_ns() // 1_000_000:013d}-{os.getpid()}-{self._seq:06d}{SEGMENT_SUFFIX}"
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            except FileNotFoundError:     # the directory could not be made at start (disk full then)
                self._make_directory()
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            fcntl.flock(fd, fcntl.LOCK_EX)
            sync_directory(self.directory, best_effort=True)     # the segment's name survives a power loss
            self._writer = (path, fd)
            self._writer_size = 0
        return self._writer[1]

    def _close_writer(self) -> None:
        if self._writer is not None:
            path, fd = self._writer
            self._writer = None
            try:
                os.fsync(fd)
            except OSError as e:      # the kernel may have dropped unwritable pages: replay skips what is torn
                log.error("eventide spool segment %s could not be synced to disk: %s", path, e)
            finally:
                os.close(fd)          # releases the flock: the segment is now complete and replayable

    def _make_directory(self) -> None:
        """Create the spool directory, syncing each new directory's parent so its name survives a power loss."""
        missing = [d for d in (self.directory, *self.directory.parents) if not d.exists()]
        self.directory.mkdir(parents=True, exist_ok=True)
        for created in reversed(missing):
            sync_directory(created.parent, best_effort=True)

    # Head ------------------------------------------------------------------------------------------------
    def segments(self) -> list[Path]:
        return sorted(self.directory.glob(f"*{SEGMENT_SUFFIX}"))

    def is_empty(self) -> bool:
        return not self.segments()

    def read(self, max_lines: int) -> SpoolChunk | None:
        """The next unacknowledged lines of the oldest segment this process may replay, or None. Torn or damaged
        lines are left out (``SpoolChunk.skipped``; counted when the chunk is committed)."""
        with self._lock:
            for segment in self.segments():
                if self._writer is not None and segment == self._writer[0]:
                    self._close_writer()      # replay what we wrote so far; later appends start a new segment
                fd = self._readers.get(segment) or self._lock_for_reading(segment)
                if fd is None:
                    continue
                start = self._positions.get(segment)
                if start is None:
                    start = _read_position(segment)
                size = os.fstat(fd).st_size
                data = os.pread(fd, min(max(size - start, 0), max_lines * 4096 + 65536), start)
                lines = data.split(b"\n")
                complete, torn = lines[:-1][:max_lines], lines[-1]
                end = start + sum(len(line) + 1 for line in complete)
                if not complete and torn and start + len(torn) >= size:
                    # Only a last line without its newline is left: its writer died mid-write, it never completes.
                    return SpoolChunk(segment, [], size, True, skipped=1, skipped_bytes=len(torn))
                good = [line for line in complete if _whole(line)]
                if end >= size and good and not _parses(good[-1]):
                    good.pop()                # a crash can also leave a last line whose newline landed, not all of it
                skipped = len(complete) - len(good)
                skipped_bytes = sum(len(line) + 1 for line in complete) - sum(len(line) + 1 for line in good)
                return SpoolChunk(segment, good, end, end >= size, skipped, skipped_bytes)
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
            if chunk.skipped:
                self.torn_lines += chunk.skipped
                log.warning("eventide spool segment %s: %d torn or damaged line(s) skipped", chunk.segment,
                            chunk.skipped)
            self.size_bytes -= sum(len(line) + 1 for line in chunk.lines) + chunk.skipped_bytes
            self.size_bytes = max(self.size_bytes, 0)
            position = chunk.segment.with_name(chunk.segment.name + POSITION_SUFFIX)
            if chunk.reaches_end:
                chunk.segment.unlink(missing_ok=True)
                position.unlink(missing_ok=True)
                sync_directory(chunk.segment.parent, best_effort=True)
                self._positions.pop(chunk.segment, None)
                fd = self._readers.pop(chunk.segment, None)
                if fd is not None:
                    os.close(fd)
            else:
                # This process holds the segment: its own record of the position is the one that counts. The
                # file only tells a later process where to resume; if it cannot be written (a full disk), a
                # crash would resend the chunk, which the event ids make recognisable.
                self._positions[chunk.segment] = chunk.end_offset
                tmp = position.with_name(position.name + ".tmp")
                try:
                    tmp.write_text(str(chunk.end_offset))
                    os.replace(tmp, position)
                except OSError as e:
                    tmp.unlink(missing_ok=True)
                    log.warning("eventide spool position %s not saved (%s)", position, e)

    def put_back(self, chunk: SpoolChunk, lines: list[bytes]) -> int:
        """Before committing ``chunk``: these of its lines (Kafka did not acknowledge them) go back to the head, in a
        segment named to sort just before the chunk's own, so they are replayed next, ahead of the rest of it (and
        of everything spooled since). Appended at the tail they would come after newer events. A crash before the
        chunk's commit replays them twice, which the event ids make recognisable. Returns how many were written
        (a failed write drops and counts them all, as :meth:`append` does)."""
        if not lines:
            return 0
        with self._lock:
            self._seq += 1
            written_ms = int(chunk.segment.name.split("-", 1)[0])
            path = chunk.segment.with_name(f"{written_ms - 1:013d}-{os.getpid()}-{self._seq:06d}{SEGMENT_SUFFIX}")
            data = b"".join(line + b"\n" for line in lines)
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                try:
                    written = 0
                    while written < len(data):
                        n = os.write(fd, data[written:])
                        if n <= 0:      # as in append: a write that makes no progress is a full disk, not a loop
                            raise OSError(errno.ENOSPC, "no progress writing the spool")
                        written += n
                    os.fsync(fd)
                finally:
                    os.close(fd)
                sync_directory(self.directory, best_effort=True)
            except OSError as e:
                path.unlink(missing_ok=True)
                self._count_failure(e, len(lines))
                return 0
            self.size_bytes += len(data)
            return len(lines)

    def close(self) -> None:
        with self._lock:
            self._close_writer()
            for fd in self._readers.values():
                os.close(fd)
            self._readers.clear()
            self._positions.clear()

    def forget_after_fork(self) -> None:
        """In a forked child: drop the parent's descriptors without touching them (the parent keeps its locks)."""
        self._writer = None
        self._readers = {}
        self._positions = {}
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


def _whole(line: bytes) -> bool:
    """A cheap check of a spooled line's shape, as the sender reads it: an envelope body ending in its event time,
    or ``~`` and the hex of a raw record. What fails it was torn or damaged, and would stall the sender."""
    first = line[:1]
    if first == b"{":
        tail = line[line.rfind(b":") + 1:]
        return (tail[1:] if tail[:1] == b"-" else tail).isdigit()
    if first == b"~":
        try:
            bytes.fromhex(line[1:].decode("ascii"))
        except (ValueError, UnicodeDecodeError):
            return False
        return True
    return False


def _parses(line: bytes) -> bool:
    """The line is one whole record (the segment's last line is checked in full: a crash tears the tail)."""
    if line[:1] != b"{":
        return True               # a raw record: ``_whole`` already decoded all of it
    try:
        json.loads(line + b"}")
    except ValueError:
        return False
    return True
