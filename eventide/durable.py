"""fsync of files and directories: what makes a write, a new name or a rename survive a power loss.

Shared by every component that publishes files (the SDK's spool, the accepted-events log, the store's generated
passwords): write, sync the file, rename, sync the directory that holds the name.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path


def sync_file(path: Path) -> None:
    """fsync ``path``'s data and metadata."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sync_directory(directory: Path, *, best_effort: bool = False) -> None:
    """fsync a directory, so the names created, renamed or removed in it survive a power loss. A file system that
    cannot sync a directory (``EINVAL``/``ENOTSUP``: some FUSE and network mounts) makes names durable its own way,
    so that is not an error. ``best_effort``: any failure is ignored (a caller that must never raise, the SDK)."""
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        if best_effort:
            return
        raise
    try:
        os.fsync(fd)
    except OSError as exc:
        if not best_effort and exc.errno not in (errno.EINVAL, errno.ENOTSUP):
            raise
    finally:
        os.close(fd)
