"""Detached local processes (broker, stream job, load generator, dashboard) with pid and log files.

Each service runs in its own session (so ``stack down`` can signal its whole process group), writes its output to
``<data_dir>/logs/<name>.log`` and records its pid in ``<data_dir>/run/<name>.pid``.
"""

from __future__ import annotations

import contextlib
import functools
import os
import random
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eventide.config import Config


@dataclass(frozen=True)
class ServiceState:
    name: str
    pid: int | None
    running: bool
    log: Path


def _pid_file(config: Config, name: str) -> Path:
    return config.data_dir / "run" / f"{name}.pid"


def log_file(config: Config, name: str) -> Path:
    return config.data_dir / "logs" / f"{name}.log"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child (we started it and nobody reaped it) is not running.
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(") ", 1)[1].split(" ", 1)[0] != "Z"
    except (FileNotFoundError, IndexError):
        return True


def state(config: Config, name: str) -> ServiceState:
    pid_path = _pid_file(config, name)
    pid = int(pid_path.read_text()) if pid_path.exists() else None
    return ServiceState(name, pid, pid is not None and _alive(pid), log_file(config, name))


def start(config: Config, name: str, argv: list[str], env: dict[str, str] | None = None,
          cwd: Path | None = None) -> subprocess.Popen[bytes]:
    """Start ``argv`` detached; refuses when a live process is already recorded for ``name``."""
    current = state(config, name)
    if current.running:
        raise RuntimeError(f"{name} already running (pid {current.pid})")
    log = log_file(config, name)
    log.parent.mkdir(parents=True, exist_ok=True)
    _pid_file(config, name).parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env={**os.environ, **(env or {})}, cwd=cwd or config.root, start_new_session=True,
        )
    _pid_file(config, name).write_text(str(proc.pid))
    return proc


def stop(config: Config, name: str, timeout_s: float = 30.0) -> bool:
    """SIGTERM the service's process group, SIGKILL after ``timeout_s``. Returns True if something was stopped."""
    current = state(config, name)
    pid_path = _pid_file(config, name)
    if not current.running or current.pid is None:
        pid_path.unlink(missing_ok=True)
        return False
    _signal_group(current.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and _alive(current.pid):
        _reap(current.pid)
        time.sleep(0.2)
    if _alive(current.pid):
        _signal_group(current.pid, signal.SIGKILL)
        time.sleep(0.5)
        _reap(current.pid)
    pid_path.unlink(missing_ok=True)
    return True


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


EPHEMERAL_PORTS = Path("/proc/sys/net/ipv4/ip_local_port_range")
LOWEST_SERVICE_PORT = 10_000
_PICKER = random.SystemRandom()


def service_ports(ephemeral_range: str | None) -> range:
    """Where :func:`free_port` picks: from :data:`LOWEST_SERVICE_PORT` up to the kernel's ephemeral range
    (``ephemeral_range``: its ``/proc`` text, e.g. ``"32768\t60999"``), never inside it. Every socket bound to port
    0 gets its port from that range: Spark's listener for a Python worker's connect-back, a client's own end. The
    clients of a stopped service keep dialing its port, and were that port ephemeral, such a listener could get it
    and read their bytes as its handshake ("Python worker failed to connect back: Authentication failed"). Empty
    when the range is unknown or starts too low."""
    try:
        low = int((ephemeral_range or "").split()[0])
    except (IndexError, ValueError):
        return range(0)
    return range(LOWEST_SERVICE_PORT, max(LOWEST_SERVICE_PORT, low))


@functools.cache
def default_ports() -> frozenset[int]:
    """Every port the configuration's defaults name (each field called ``port`` or ``…_port(s)``, in every section):
    a configuration that sets some of its ports to free ones keeps the others, and refuses two equal ones."""
    found: set[int] = set()

    def walk(values: dict[str, Any]) -> None:
        for name, value in values.items():
            if isinstance(value, dict):
                walk(value)
            elif name == "port" or name.endswith(("_port", "_ports")):
                found.update(value if isinstance(value, list) else [value])

    walk(Config().model_dump())
    return frozenset(p for p in found if isinstance(p, int))


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on right now, outside the ephemeral range (:func:`service_ports`) and none of the
    configuration's default ports (:func:`default_ports`), for a service of a test, a benchmark or a second stack;
    any free port when that range leaves none."""
    ports = service_ports(EPHEMERAL_PORTS.read_text() if EPHEMERAL_PORTS.exists() else None)
    # The system's randomness: a test seeding `random` must not make two test processes pick the same ports.
    for port in _PICKER.sample(ports, min(100, len(ports))):
        if port in default_ports():
            continue
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:     # taken, or in TIME_WAIT
                continue
            return port
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def tail(path: Path, lines: int = 30) -> str:
    if not path.exists():
        return ""
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
