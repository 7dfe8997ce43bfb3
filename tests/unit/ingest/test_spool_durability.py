"""What reaches the disk survives: the SDK's spool on a full disk and after a crash, and the accepted-events log's
publish order.

The spool: an append lands whole or not at all (a full file system leaves no torn line, and every refused event is
counted), and a torn or damaged line left by a crash is skipped and counted on replay while everything around it is
sent. The end-to-end case, with an SDK app and a real broker, is in the fault suite (tests/integration/test_faults.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

from analytics import accepted_log
from analytics.accepted_log import BatchMeta
from eventide.config import load_config
from ingest.sdk.spool import Spool
from tests.support.fault_injection import size_limited_directory

REPO = Path(__file__).resolve().parents[3]


_BODY = b'{"v":1,"id":"%036d","kind":"metric","app":"a","device":"d","name":"seq","value":%d.0,' \
        b'"event_time":1700000000000'


def body(i: int) -> bytes:
    """A spooled envelope as the sender writes it: without its closing ``sent_time``."""
    return _BODY % (i, i)


def drain(spool: Spool) -> list[bytes]:
    """Replay a spool to the end as the sender does (every chunk acknowledged)."""
    replayed = []
    while (chunk := spool.read(1000)) is not None:
        replayed += chunk.lines
        spool.commit(chunk)
    return replayed


def segment_with(directory: Path, content: bytes) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    segment = directory / "0001700000000000-1-000001.spool"
    segment.write_bytes(content)
    return segment


# Torn and damaged lines on replay ---------------------------------------------------------------------------
def test_a_torn_last_line_left_by_a_crash_is_skipped_and_counted_and_every_line_before_it_replays(tmp_path):
    """Given a segment whose writer was killed mid-write (its last line has no newline), then replay sends every
    whole line, skips the torn one, counts it, and leaves nothing behind."""
    segment = segment_with(tmp_path / "spool", b"".join(body(i) + b"\n" for i in range(3)) + body(3)[:40])
    spool = Spool(tmp_path / "spool", 1 << 20, 1 << 20)

    assert drain(spool) == [body(0), body(1), body(2)]
    assert spool.torn_lines == 1
    assert spool.size_bytes == 0
    assert not segment.exists() and not list((tmp_path / "spool").iterdir())


def test_a_last_line_whose_newline_landed_but_not_all_its_bytes_is_skipped_and_counted(tmp_path):
    """Given a segment cut by a power loss, whose last line ends in a newline but holds zeros where the data did not
    land, then that line is skipped and counted, and the lines before it replay."""
    damaged = body(2)[:20] + b"\0" * 30 + body(2)[50:]
    segment_with(tmp_path / "spool", body(0) + b"\n" + body(1) + b"\n" + damaged + b"\n")
    spool = Spool(tmp_path / "spool", 1 << 20, 1 << 20)

    assert drain(spool) == [body(0), body(1)]
    assert spool.torn_lines == 1 and spool.size_bytes == 0


def test_a_damaged_line_inside_a_segment_is_skipped_and_the_lines_after_it_replay(tmp_path):
    """A zero-filled line (data that never landed) would otherwise reach the sender, which cannot close it into an
    envelope: the replay would stall on it forever."""
    segment_with(tmp_path / "spool", body(0) + b"\n" + b"\0" * 64 + b"\n" + b"~zz\n" + body(1) + b"\n"
                 + b"~" + b"raw".hex().encode() + b"\n")
    spool = Spool(tmp_path / "spool", 1 << 20, 1 << 20)

    assert drain(spool) == [body(0), body(1), b"~" + b"raw".hex().encode()]
    assert spool.torn_lines == 2 and spool.size_bytes == 0


# Lines a replay could not deliver ------------------------------------------------------------------------------
def test_lines_a_replay_chunk_could_not_deliver_are_replayed_next_in_order_ahead_of_newer_ones(tmp_path):
    # Given a spool of events 0-9 read in chunks of 4, whose first chunk's last two lines Kafka did not acknowledge
    # (the broker went away mid-chunk) while events 10 and 11 were spooled,
    spool = Spool(tmp_path / "spool", 1 << 20, 1 << 20)
    spool.append([body(i) for i in range(10)])
    chunk = spool.read(4)
    spool.append([body(10), body(11)])
    assert spool.put_back(chunk, [body(2), body(3)]) == 2
    spool.commit(chunk)
    # the next replay sends 2 and 3 first, then the rest, then the newer events; and a chunk of the put-back lines
    # that fails again goes back ahead of them in turn.
    again = spool.read(1)
    assert again.lines == [body(2)]
    spool.put_back(again, again.lines)
    spool.commit(again)
    assert drain(spool) == [body(i) for i in range(2, 12)]
    assert spool.is_empty() and spool.size_bytes == 0


# Appends that the disk refuses ---------------------------------------------------------------------------------
_FILL = """
import json, random, resource, signal, sys
from pathlib import Path
from ingest.sdk.spool import Spool
directory, limit = Path(sys.argv[1]), json.loads(sys.argv[2])
if limit:                   # no tmpfs: the file-size limit instead (tests.support.fault_injection.limit_file_size)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
body = lambda i: %r %% (i, i)
spool = Spool(directory, 1 << 30, int(sys.argv[3]))      # its own bound far above what the disk holds
rng, i, kept, sent = random.Random(7), 0, [], 0
for _ in range(300):
    batch = [body(i + k) for k in range(rng.choice([1, 3, 40, 200]))]     # some fit in what is left, some do not
    n = spool.append(batch)
    assert n in (0, len(batch)), n
    kept += list(range(i, i + n))
    sent, i = sent + len(batch), i + len(batch)
spool.close()
print(json.dumps({"sent": sent, "kept": kept, "dropped_full": spool.dropped_full,
                  "dropped_error": spool.dropped_error, "size_bytes": spool.size_bytes}))
"""


@pytest.mark.parametrize(("mount", "segment_bytes"), [(True, 1 << 20), (True, 16 * 1024), (False, 1 << 20)],
                         ids=["tmpfs-one-segment", "tmpfs-segments-roll", "file-size-limit"])
def test_on_a_full_file_system_an_append_lands_whole_or_not_at_all_and_every_refused_line_is_counted(
        tmp_path, mount, segment_bytes):
    """Given a spool on a 64 KiB file system (a tmpfs; where mounting is refused, and in the last case always, a
    64 KiB file-size limit: ``EFBIG`` after a short write) and far more lines than fit, in batches of several sizes,
    then every batch is written whole or refused and counted (``dropped_full``), no segment ends in a torn line, and
    replay gives back exactly the lines written."""
    with size_limited_directory(tmp_path, 64 * 1024, mount=mount) as (directory, limit):
        done = subprocess.run([sys.executable, "-c", _FILL % _BODY, str(directory / "spool"), json.dumps(limit),
                               str(segment_bytes)], cwd=REPO, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr[-3000:]
        filled = json.loads(done.stdout)
        segments = sorted((directory / "spool").glob("*.spool"))
        contents = [s.read_bytes() for s in segments]
        replayed = drain(spool := Spool(directory / "spool", 1 << 30, segment_bytes))

    assert filled["dropped_full"] > 0 and filled["dropped_error"] == 0, "the disk never filled: nothing was tested"
    assert len(filled["kept"]) + filled["dropped_full"] == filled["sent"]
    assert all(c.endswith(b"\n") for c in contents if c), "a torn line was left in a segment"
    assert filled["size_bytes"] == sum(map(len, contents))
    assert b"".join(contents).split(b"\n")[:-1] == [body(i) for i in filled["kept"]]
    assert replayed == [body(i) for i in filled["kept"]] and spool.torn_lines == 0
    if segment_bytes < 64 * 1024:
        assert len(segments) > 1


def test_a_spool_that_cannot_create_its_segment_counts_the_lines_as_errors_and_raises_nothing(tmp_path):
    """Given a spool whose directory was replaced by a file (any write error but a full disk), then appends return
    0 and count their lines as ``dropped_error``; nothing raises into the sender."""
    spool = Spool(tmp_path / "spool", 1 << 20, 1 << 20)
    (tmp_path / "spool").rmdir()
    (tmp_path / "spool").write_text("not a directory")

    assert spool.append([body(0), body(1)]) == 0
    assert spool.append([body(2)]) == 0
    assert (spool.dropped_error, spool.dropped_full, spool.size_bytes) == (3, 0, 0)


# What is synced, and when ---------------------------------------------------------------------------------------
@pytest.fixture
def synced(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The paths ``os.fsync`` is called on, in order (the real fsync still runs)."""
    calls: list[str] = []
    real = os.fsync

    def spy(fd: int) -> None:
        calls.append(os.readlink(f"/proc/self/fd/{fd}"))
        real(fd)

    monkeypatch.setattr(os, "fsync", spy)
    yield calls


def test_a_segment_is_synced_when_rolled_and_closed_and_its_directory_when_segments_come_and_go(tmp_path, synced):
    spool = Spool(tmp_path / "spool", 1 << 20, 1024)
    directory = str(tmp_path / "spool")
    assert synced == [str(tmp_path)]                    # the new spool directory's name
    synced.clear()
    spool.append([body(i) for i in range(12)])          # past 1 KiB: the segment rolls
    [first] = spool.segments()
    assert synced == [directory, str(first)]             # created (its name synced), then rolled (its data)
    synced.clear()
    spool.append([body(99)])
    spool.close()
    second = next(s for s in spool.segments() if s != first)
    assert synced == [directory, str(second)]
    synced.clear()
    assert len(drain(Spool(tmp_path / "spool", 1 << 20, 1024))) == 13
    assert synced == [directory, directory]               # each replayed segment's removal


def test_the_accepted_log_publishes_a_batch_only_after_its_files_and_metadata_are_on_disk(tmp_path, synced,
                                                                                         monkeypatch):
    """After a power loss a published accept batch must be whole or absent: each partition's file is synced by the
    task that staged it, and before the rename that publishes the batch's directory the driver syncs the padding
    files, the staged directory (its names) and the metadata (with its directory); the directory the batch was
    renamed into after it. The partials likewise."""
    renames: list[str] = []
    real_rename = Path.rename

    def rename(self: Path, target: Path) -> Path:
        renames.append(str(target))
        synced.append(f"rename -> {target}")
        return real_rename(self, target)

    monkeypatch.setattr(Path, "rename", rename)
    config = load_config(environ={}, root=str(tmp_path), paths={"data_dir": str(tmp_path / "var")})
    events = pa.table({"id": ["a", "b"], "value": [1.0, 2.0]})
    staged = {root: accepted_log.staging_dir(root, 7, "attempt")
              for root in (config.accepted_events_dir, config.window_partials_dir)}
    for directory in staged.values():
        accepted_log.stage_file(directory, 1, [events])
    staging = synced[:]
    synced.clear()
    accepted_log.publish(config, BatchMeta(7, {"t": {"1": 0}}, {"t": {"1": 2}}, 1, 2, events=2), "attempt")

    for directory in staged.values():   # each task's file: data synced, then renamed within the staging directory
        [data] = [p for p in staging if p.startswith(f"{directory}/.00001-")]
        assert staging.index(data) < staging.index(f"rename -> {directory}/00001.parquet")
    target = accepted_log.batch_dir(config.accepted_events_dir, 7)
    partials = accepted_log.batch_dir(config.window_partials_dir, 7)
    meta = config.accepted_events_dir / "_meta" / "7.json"
    first_publish = synced[:synced.index(f"rename -> {target}") + 2]
    padding = [p for p in first_publish if p.startswith(f"{staged[config.accepted_events_dir]}/.")]
    assert len(padding) == config.kafka.events_partitions - 1
    assert first_publish[-5:] == [str(staged[config.accepted_events_dir]), str(meta), str(meta.parent),
                                  f"rename -> {target}", str(target.parent)]
    assert max(first_publish.index(p) for p in padding) < first_publish.index(str(meta))
    second = synced[len(first_publish):]
    assert second[-3:] == [str(staged[config.window_partials_dir]), f"rename -> {partials}", str(partials.parent)]
    assert [r for r in renames if "_tmp" not in r] == [str(target), str(partials)]
    assert accepted_log.meta(config, 7).events == 2 and accepted_log.published(config, 7)


# Names that are path components ----------------------------------------------------------------------------
@pytest.mark.parametrize(("app", "device"), [("..", ".."), (".", "."), ("..", "phone-1"), ("shop", ".."),
                                             ("../..", "../../etc"), ("", "")])
def test_an_app_or_device_named_dot_or_dot_dot_keeps_its_spool_below_the_spool_root(tmp_path, app, device):
    """Given an app or device named ``..`` or ``.`` (or holding separators), then its spool directory and every
    segment it writes are strictly below the spool root, two levels down, and nothing appears beside the root."""
    from ingest.sdk.spool import spool_directory

    root = tmp_path / "nest" / "spool"
    root.mkdir(parents=True)
    directory = spool_directory(root, app, device)
    spool = Spool(directory, 1 << 20, 1 << 20)
    spool.append([body(1), body(2)])
    spool.close()

    assert directory.resolve().parent.parent == root.resolve()
    written = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert written and all(root.resolve() in p.resolve().parents for p in written)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["nest"]
    assert sorted(p.name for p in (tmp_path / "nest").iterdir()) == ["spool"]


def test_dot_names_take_no_other_names_spool():
    """``.`` and ``..`` are spelled with ``%``, which every other name has replaced: no other name shares theirs."""
    from ingest.sdk.spool import safe_name

    names = [".", "..", "_", "__", "%2E", "%2E%2E", "...", "a.b"]
    assert len({safe_name(n) for n in names}) == len(names)
    assert (safe_name("."), safe_name("..")) == ("%2E", "%2E%2E")
