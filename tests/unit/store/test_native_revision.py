"""A Native answer in the layout of the client's protocol revision (``store.server.native``), checked with a reader
nobody here wrote: clickhouse-connect's own Native parser, which reads ``BlockInfo`` at revision 54405. chDB makes the
answers, in several blocks of every column type the product and Grafana's panels read. (Revision 54460, with its
per-column serialization byte, is read by clickhouse-go itself in tests/integration/test_grafana_clients.py.)"""

from __future__ import annotations

from typing import Any

import chdb
import pytest
from clickhouse_connect.driver.query import QueryContext
from clickhouse_connect.driver.transform import NativeTransform
from clickhouse_connect.driverc.buffer import ResponseBuffer

from store.server.native import UnsupportedNative, for_revision, split_type

COLUMNS = [
    "number AS n", "toString(number * 7919) AS text", "toFixedString(toString(number % 10), 1) AS fixed",
    "toLowCardinality(toString(number % 3)) AS lc", "toLowCardinality(if(number % 4 = 0, NULL, 'x')) AS lc_null",
    "if(number % 2, NULL, number) AS maybe", "[toString(number), repeat('y', 200)] AS texts",
    "[[toUInt16(number)], []] AS nested", "[toLowCardinality('a'), 'b'] AS lcs", "[] :: Array(String) AS none",
    "map(toLowCardinality('route'), '/', 'k', toString(number)) AS tags",
    "CAST((toString(number), toUInt8(number)), 'Tuple(a String, b UInt8)') AS pair",
    "toDecimal64(number / 8, 3) AS d", "toDecimal128(number, 2) AS d128",
    "toDateTime64('2026-11-29 10:00:00.125', 3, 'UTC') + number AS t64", "toDate('2026-11-29') + number AS day",
    "toUUID('61f0c404-5cb3-11e7-907b-a6006ad3dba0') AS u", "toIPv4('10.0.0.1') AS ip4", "toIPv6('::1') AS ip6",
    "CAST(if(number % 2, 'a', 'b'), 'Enum8(\\'a\\' = 1, \\'b\\' = 2)') AS e", "number % 2 = 0 AS flag",
    "toFloat32(number) / 3 AS f32", "toInt128(number) - 5 AS i128", "NULL AS nothing", "repeat('z', 300) AS long",
]


class _Body:
    """A response body as clickhouse-connect's buffer reads it."""

    def __init__(self, data: bytes) -> None:
        self.gen = iter([data])
        self.last_message = None

    def close(self, ex: Exception | None = None) -> None:
        pass


def _rows(answer: bytes, block_info: bool) -> list[tuple[Any, ...]]:
    context = QueryContext()
    context.block_info = block_info
    return NativeTransform().parse_response(ResponseBuffer(_Body(answer)), context).result_rows


def _native(sql: str) -> bytes:
    return chdb.query(sql, "Native").bytes()


@pytest.mark.parametrize("block_size", [1, 3, 1000])
def test_given_blocks_of_every_column_type_then_a_client_at_a_revision_reads_what_chdb_wrote(block_size: int) -> None:
    answer = _native(f"SELECT {', '.join(COLUMNS)} FROM numbers(20) SETTINGS max_block_size = {block_size}")
    expected = _rows(answer, block_info=False)
    assert len(expected) == 20
    assert _rows(for_revision(answer, 54405), block_info=True) == expected
    blocks = -(-20 // block_size)
    # 8 bytes of BlockInfo per block; from 54454 a serialization byte per column of each block too
    assert len(for_revision(answer, 54405)) - len(answer) == 8 * blocks
    assert len(for_revision(answer, 54460)) - len(answer) == (8 + len(COLUMNS)) * blocks


def test_given_no_revision_or_no_rows_then_the_answer_is_chdbs_own() -> None:
    answer = _native("SELECT number FROM numbers(3)")
    assert for_revision(answer, 0) == answer
    assert for_revision(b"", 54460) == b""
    empty = _native("SELECT number, toString(number) FROM numbers(10) WHERE number > 100")
    assert _rows(for_revision(empty, 54405), block_info=True) == _rows(empty, block_info=False)


@pytest.mark.parametrize(("sql", "named"), [
    ("SELECT uniqState(number) AS state FROM numbers(10)", "AggregateFunction"),
    ("SELECT 1 :: Dynamic AS dynamic", "Dynamic"),
    ("SELECT 1 :: Variant(UInt8, String) AS variant", "Variant"),
])
def test_given_a_column_whose_data_cannot_be_walked_then_it_is_refused_by_name(sql: str, named: str) -> None:
    with pytest.raises(UnsupportedNative, match=named):
        for_revision(_native(sql + " SETTINGS allow_experimental_dynamic_type = 1, "
                                   "allow_experimental_variant_type = 1"), 54460)


def test_given_an_answer_cut_anywhere_then_it_is_refused_never_misread() -> None:
    answer = _native("SELECT toString(number) AS text, [number] AS a, toLowCardinality('x') AS lc FROM numbers(5)")
    for cut in range(1, len(answer)):
        with pytest.raises(UnsupportedNative):
            for_revision(answer[:cut], 54460)


def test_given_type_names_then_their_arguments_split_at_the_top_level_only() -> None:
    assert split_type("Map(String, Array(Tuple(a UInt8, b String)))") == (
        "Map", ["String", "Array(Tuple(a UInt8, b String))"])
    assert split_type("Enum8('a, b' = 1, 'c)' = 2)") == ("Enum8", ["'a, b' = 1", "'c)' = 2"])
    assert split_type("DateTime64(3, 'UTC')") == ("DateTime64", ["3", "'UTC'"])
    assert split_type("UInt64") == ("UInt64", [])
