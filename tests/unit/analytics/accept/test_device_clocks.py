"""A batch's device clocks (analytics.accept.task.clock_offsets, stored by analytics.accept.writer.device_clocks):
each task reports its partition's clock offsets per device, and the driver stores them for the batch in one insert."""

from datetime import UTC, datetime

import pyarrow as pa

from analytics.accept.task import clock_offsets, ipc_stream
from analytics.accept.writer import device_clocks

NOW = datetime(2027, 1, 1, tzinfo=UTC)
T0 = 1_800_000_000_000


def accepted(*events: tuple[str, str, int, int]) -> pa.Table:
    """Accepted events of (app, device, clock offset ms, received ms)."""
    return pa.table({
        "app": [e[0] for e in events], "device": [e[1] for e in events],
        "id": [f"e{i}" for i in range(len(events))], "clock_offset_ms": pa.array([e[2] for e in events], pa.int64()),
        "received_time": pa.array([e[3] for e in events], pa.timestamp("ms", tz="UTC")),
    })


def test_each_partitions_devices_are_one_row_each_stamped_with_the_batch():
    partition_0 = accepted(("shop", "d1", -200, T0), ("shop", "d1", -100, T0 + 1_000))
    partition_1 = accepted(("shop", "d2", 50, T0 + 500))
    results = pa.table({"device_clocks": pa.array([ipc_stream(clock_offsets(partition_0)),
                                                   ipc_stream(clock_offsets(partition_1))], pa.binary())})
    rows = sorted(device_clocks(7, results, NOW).to_pylist(), key=lambda r: r["device"])
    assert [(r["app"], r["device"], r["batch_id"], r["events"], r["offset_min_ms"], r["offset_max_ms"],
             r["offset_avg_ms"], r["recorded_at"]) for r in rows] == [
        ("shop", "d1", 7, 2, -200, -100, -150.0, NOW), ("shop", "d2", 7, 1, 50, 50, 50.0, NOW)]
    assert rows[0]["last_received"] == datetime.fromtimestamp((T0 + 1_000) / 1000, UTC)


def test_a_batch_without_reports_stores_no_clock_rows():
    assert device_clocks(7, pa.table({"device_clocks": pa.array([None], pa.binary())}), NOW).num_rows == 0
