"""An accept task's valid records: held in memory up to its budget, beyond it on local disk, cut into slices that
cover every record once, in order (analytics.accept.spill)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from analytics.accept.spill import SLICES_PER_BUDGET, HeldRecords


def chunk(first: int, rows: int, text_bytes: int = 100) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict({"offset": list(range(first, first + rows)),
                                       "message": ["x" * text_bytes] * rows})


def spill_files(directory: Path) -> list[Path]:
    return sorted(directory.glob("eventide-accept-*"))


def covered(slices: list[tuple[int, int]]) -> list[int]:
    return [row for start, end in slices for row in range(start, end)]


def test_records_within_the_budget_stay_in_memory_and_are_one_slice(tmp_path: Path) -> None:
    with HeldRecords(budget_bytes=1_000_000, directory=str(tmp_path)) as held:
        held.add(chunk(0, 100))
        held.add(chunk(100, 50))
        table = held.table()
        assert not held.spilled and held.spilled_bytes == 0 and spill_files(tmp_path) == []
        assert table.column("offset").to_pylist() == list(range(150))
        assert list(held.slices(table)) == [(0, 150)]


def test_records_over_the_budget_are_spilled_read_back_in_order_and_the_file_is_gone(tmp_path: Path) -> None:
    chunks = [chunk(i * 1000, 1000) for i in range(5)]   # ~110 kB each
    with HeldRecords(budget_bytes=200_000, directory=str(tmp_path)) as held:
        for piece in chunks:
            held.add(piece)
        assert held.spilled and spill_files(tmp_path) != []
        assert held.spilled_bytes == sum(piece.nbytes for piece in chunks)   # the ones held before the spill too
        table = held.table()
        assert spill_files(tmp_path) == []   # mapped and removed at once: nothing is left if the task dies
        assert table.column("offset").to_pylist() == list(range(5000))
        assert table.column("message").to_pylist() == ["x" * 100] * 5000


def test_a_spilled_batch_is_cut_into_slices_of_a_share_of_the_budget_covering_every_row_once(tmp_path: Path) -> None:
    budget = 200_000
    with HeldRecords(budget_bytes=budget, directory=str(tmp_path)) as held:
        for i in range(5):
            held.add(chunk(i * 1000, 1000))
        table = held.table()
        slices = list(held.slices(table))
    assert covered(slices) == list(range(5000))
    assert len(slices) > 5   # within chunks too
    for start, end in slices:
        assert table.slice(start, end - start).nbytes <= budget // SLICES_PER_BUDGET + 200


def test_the_same_records_and_budget_give_the_same_slices(tmp_path: Path) -> None:
    def cut() -> list[tuple[int, int]]:
        with HeldRecords(budget_bytes=150_000, directory=str(tmp_path)) as held:
            for i in range(3):
                held.add(chunk(i * 700, 700, text_bytes=300))
            return list(held.slices(held.table()))

    assert cut() == cut()


def test_leaving_before_reading_removes_the_spill_file(tmp_path: Path) -> None:
    with HeldRecords(budget_bytes=100_000, directory=str(tmp_path)) as held:
        held.add(chunk(0, 2000))
        assert spill_files(tmp_path) != []
    assert spill_files(tmp_path) == []
