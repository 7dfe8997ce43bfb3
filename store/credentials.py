"""The embedded store's passwords: generated on first start into a file under the data directory, never empty.

chDB has no users of its own, so ``eventide store serve`` enforces two, as a ClickHouse server's users.xml would:
the writer ``default`` (the stream job, migrations, the CLI) and a read-only user (``store.reader_user``, for the
dashboard and the evaluator). Their passwords live in ``<data_dir>/store-credentials.json`` (mode 0600), created
atomically by whichever local component needs it first; every local component reads it through :func:`load`.
An explicitly configured ``store.password`` / ``store.reader_password`` takes the place of the generated one.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import stat
from dataclasses import dataclass
from pathlib import Path

from eventide.config import Config
from eventide.durable import sync_directory

FILE_NAME = "store-credentials.json"
WRITER_USER = "default"


@dataclass(frozen=True)
class Credentials:
    """The embedded store's two users and their passwords."""

    writer_password: str
    reader_user: str
    reader_password: str


def path(config: Config) -> Path:
    """Where the generated passwords are kept (beside the chDB directory, not inside it)."""
    return config.data_dir / FILE_NAME


def load(config: Config) -> Credentials:
    """The embedded store's credentials: configured passwords first, else the generated file's (created if absent)."""
    generated = _generated(path(config))
    return Credentials(config.store.password or generated[WRITER_USER], config.store.reader_user,
                       config.store.reader_password or generated["reader"])


def _generated(file: Path) -> dict[str, str]:
    try:
        return _read(file)
    except FileNotFoundError:
        pass
    file.parent.mkdir(parents=True, exist_ok=True)
    fresh = {WRITER_USER: secrets.token_urlsafe(24), "reader": secrets.token_urlsafe(24)}
    staged = file.with_name(f".{file.name}.{os.getpid()}.{secrets.token_hex(4)}")
    # O_EXCL + 0600 from the start: the passwords are never readable by others, not even for a moment.
    fd = os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w") as out:
            json.dump(fresh, out)
            out.flush()
            os.fsync(out.fileno())
        try:
            os.link(staged, file)          # atomic, and fails if another process published its file first
        except FileExistsError:
            return _read(file)
        sync_directory(file.parent)
        return fresh
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(staged)


def _read(file: Path) -> dict[str, str]:
    mode = stat.S_IMODE(file.stat().st_mode)
    if mode & 0o077:                       # someone widened it: narrow it again before trusting it
        os.chmod(file, 0o600)
    data = json.loads(file.read_text())
    if not isinstance(data, dict) or not all(isinstance(data.get(k), str) and data[k] for k in (WRITER_USER, "reader")):
        raise RuntimeError(f"{file}: not the store's credentials file (expected non-empty 'default' and 'reader'); "
                           "remove it to have new passwords generated")
    return data
