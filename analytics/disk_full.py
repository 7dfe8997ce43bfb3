"""A full disk stops the job, naming the directory, instead of losing input (docs/operations.md, "Retention and
lag"): a write of a micro-batch that finds no space fails the batch before Spark commits it, so it runs again, whole,
once there is space."""

from __future__ import annotations

import errno
import re
from pathlib import Path

from pyspark.sql import DataFrame

from analytics import sinks
from eventide.config import Config

DISK_FULL = "disk full"
_NO_SPACE = re.compile(r"No space left on device|Disk quota exceeded|ENOSPC|EDQUOT")


class DiskFull(OSError):
    """A write of the job found no space left: the micro-batch stops uncommitted (it runs again on restart)."""


def reports_disk_full(error: str) -> bool:
    """Whether a query's failure (Spark's text of it) is a full disk, ours or Spark's own checkpoint write's."""
    return bool(_NO_SPACE.search(error)) or DISK_FULL in error


def _is_disk_full(exc: BaseException) -> bool:
    return (isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)) or bool(
        _NO_SPACE.search(str(exc)))


def stop_on_disk_full(config: Config, query: str, writer: sinks.BatchWriter) -> sinks.BatchWriter:
    """``writer``, raising :class:`DiskFull` naming the directory when a write of its batch (the accepted-events
    files, the window partials, their metadata) finds the disk full. The exception fails the micro-batch before
    Spark commits it, so the query stops there and the batch runs again, whole, once there is space: nothing is
    skipped. (An ENOSPC of Spark's own checkpoint writes fails the query in the JVM; ``failure_message`` says the
    same for it.)"""
    def write(batch: DataFrame, batch_id: int) -> None:
        try:
            writer(batch, batch_id)
        except DiskFull:
            raise
        except OSError as exc:
            if not _is_disk_full(exc):
                raise
            directory = Path(exc.filename).parent if getattr(exc, "filename", None) else config.checkpoint_dir
            raise DiskFull(errno.ENOSPC, f"{DISK_FULL}: no space left in {directory} ({exc}); the {query} query "
                                         f"stops at micro-batch {batch_id}, uncommitted: free space there and "
                                         f"restart the job, the batch then runs again (nothing is skipped)") from exc
    return write


def failure_message(config: Config, query: str, error: str) -> str:
    """What the job says when ``query`` failed with ``error`` (Spark's text of the exception): a full disk in one
    line naming the directory, anything else as Spark reported it."""
    if not reports_disk_full(error):
        return f"query {query} failed: {error}"
    ours = re.search(rf"{DISK_FULL}: [^\n]*", error)
    if ours:
        return f"query {query} stopped, {ours.group(0)}"
    return (f"query {query} stopped, {DISK_FULL}: no space left writing its checkpoint under {config.checkpoint_dir} "
            f"(stream.checkpoint_dir); the micro-batch was not committed: free space there and restart the job, it "
            f"runs again (nothing is skipped). Spark said: {error.splitlines()[0][:500]}")
