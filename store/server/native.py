"""ClickHouse's Native format as a server sends it to a client that names its protocol revision.

A ClickHouse server answers ``default_format=Native`` with ``?client_protocol_version=N`` (what clickhouse-go, the
client inside Grafana's ClickHouse data source, sends on every HTTP request) in the layout of its TCP protocol at that
revision: each block starts with its ``BlockInfo``, and from revision 54454 each column's type is followed by a byte
saying whether the column has a custom serialization. chDB writes Native as for a client without a revision (neither),
and has no setting for it. So :func:`for_revision` rewrites chDB's blocks: it walks each column's data by its type to
find where the next column starts, and copies the data as it is (dense columns: the flag is always 0).

Types whose data cannot be walked here (aggregate function states, ``Variant``, ``Dynamic``, ``JSON``, ``Object``)
are refused with a clear error instead of sending bytes the client would misread.
"""

from __future__ import annotations

WITH_BLOCK_INFO = 1
"""A client revision above 0 reads a ``BlockInfo`` before each block."""
WITH_CUSTOM_SERIALIZATION = 54454
"""From this revision a client reads a ``has_custom_serialization`` byte after each column's type."""
# BlockInfo as a server writes it: field 1, is_overflows = false; field 2, bucket_num = -1; field 0 ends it.
_BLOCK_INFO = b"\x01\x00\x02\xff\xff\xff\xff\x00"

_FIXED_WIDTH = {
    **dict.fromkeys(("UInt8", "Int8", "Bool", "Enum8", "Nothing"), 1),
    **dict.fromkeys(("UInt16", "Int16", "Enum16", "Date", "BFloat16"), 2),
    **dict.fromkeys(("UInt32", "Int32", "Float32", "Date32", "DateTime", "IPv4", "Decimal32", "Time"), 4),
    **dict.fromkeys(("UInt64", "Int64", "Float64", "DateTime64", "Decimal64", "Time64"), 8),
    **dict.fromkeys(("UInt128", "Int128", "UUID", "IPv6", "Decimal128"), 16),
    **dict.fromkeys(("UInt256", "Int256", "Decimal256"), 32),
}
_GEO = {"Point": "Tuple(Float64, Float64)", "Ring": "Array(Point)", "LineString": "Array(Point)",
        "MultiLineString": "Array(LineString)", "Polygon": "Array(Ring)", "MultiPolygon": "Array(Polygon)"}
# LowCardinality's per-block index type: the low byte is the width of its indexes; these bits say what follows.
_LC_GLOBAL_DICTIONARY = 1 << 8
_LC_ADDITIONAL_KEYS = 1 << 9
_LC_INDEX_WIDTH = {0: 1, 1: 2, 2: 4, 3: 8}


class UnsupportedNative(ValueError):
    """A result column of a type whose Native data this module cannot walk."""


def for_revision(native: bytes, revision: int) -> bytes:
    """``native`` (blocks as chDB writes them, for revision 0) in the layout a client of ``revision`` reads."""
    if revision < WITH_BLOCK_INFO or not native:
        return native
    walk = _Walk(native)
    flag = b"\x00" if revision >= WITH_CUSTOM_SERIALIZATION else b""
    out: list[bytes | memoryview] = []
    view = memoryview(native)
    while walk.pos < len(native):
        start = walk.pos
        columns, rows = walk.varint(), walk.varint()
        out += [_BLOCK_INFO, view[start:walk.pos]]
        for _ in range(columns):
            start = walk.pos
            walk.skip_string()
            type_name = bytes(walk.string()).decode()
            out += [view[start:walk.pos], flag]
            start = walk.pos
            if rows:   # a server writes no data at all, not even prefixes, for a block of no rows
                walk.prefix(type_name)
                walk.data(type_name, rows)
            out.append(view[start:walk.pos])
    if walk.pos != len(native):
        raise UnsupportedNative("the Native answer ended inside a block")
    return b"".join(out)


def split_type(type_name: str) -> tuple[str, list[str]]:
    """A type's name and its arguments' texts: ``Map(String, Array(UInt8))`` -> ``("Map", ["String",
    "Array(UInt8)"])``; quoted arguments (``Enum8('a, b' = 1)``, ``DateTime('UTC')``) are kept whole."""
    open_at = type_name.find("(")
    if open_at < 0:
        return type_name.strip(), []
    name, inner = type_name[:open_at].strip(), type_name[open_at + 1:type_name.rindex(")")]
    args, depth, quoted, start, i = [], 0, False, 0, 0
    while i < len(inner):
        char = inner[i]
        if quoted:
            if char == "\\":
                i += 1
            elif char == "'":
                quoted = False
        elif char == "'":
            quoted = True
        elif char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        elif char == "," and depth == 0:
            args.append(inner[start:i].strip())
            start = i + 1
        i += 1
    args.append(inner[start:].strip())
    return name, args


def _element_type(argument: str) -> str:
    """A tuple element's type without its name (``Tuple(a String, b UInt8)``)."""
    head = argument.split(" ", 1)
    if len(head) == 2 and "(" not in head[0] and head[0] not in _FIXED_WIDTH and head[0] != "String":
        return head[1].strip()
    return argument


def _nested_types(name: str, args: list[str]) -> list[str]:
    """The types a type's data is made of, in the order they are written."""
    if name in _GEO:
        return [_GEO[name]]
    if name == "Tuple":
        return [_element_type(a) for a in args]
    if name == "SimpleAggregateFunction":
        return args[1:]
    if name in ("Array", "Nullable", "Map", "LowCardinality"):
        return args
    return []


def _decimal_width(precision: int) -> int:
    return 4 if precision <= 9 else 8 if precision <= 18 else 16 if precision <= 38 else 32


class _Walk:
    """A position in chDB's Native bytes, moved past each part as :func:`for_revision` reads it."""

    def __init__(self, data: bytes) -> None:
        self.buf = data
        self.pos = 0

    def varint(self) -> int:
        value, shift, data, pos = 0, 0, self.buf, self.pos
        while True:
            if pos >= len(data):
                raise UnsupportedNative("the Native answer ended inside a number")
            byte = data[pos]
            pos += 1
            value |= (byte & 0x7F) << shift
            if byte < 0x80:
                self.pos = pos
                return value
            shift += 7

    def uint64(self) -> int:
        value = int.from_bytes(self.buf[self.pos:self.pos + 8], "little")
        self.skip(8)
        return value

    def skip(self, size: int) -> None:
        self.pos += size
        if self.pos > len(self.buf):
            raise UnsupportedNative("the Native answer ended inside a column")

    def string(self) -> memoryview:
        size = self.varint()
        start = self.pos
        self.skip(size)
        return memoryview(self.buf)[start:self.pos]

    def skip_string(self) -> None:
        self.skip(self.varint())

    def prefix(self, type_name: str) -> None:
        """Past the column's state prefixes, written for the whole type tree before its data."""
        name, args = split_type(type_name)
        if name == "LowCardinality":
            self.skip(8)     # the dictionary keys' serialization version
        elif name in ("Variant", "Dynamic", "JSON", "Object", "AggregateFunction"):
            raise UnsupportedNative(f"a {name} column cannot be sent in Native to a client that names its protocol "
                                    "revision: select it as a String (toString) or use another format")
        else:
            for nested in _nested_types(name, args):
                self.prefix(nested)

    def data(self, type_name: str, rows: int) -> None:
        """Past ``rows`` values of ``type_name``."""
        if not rows:
            return
        name, args = split_type(type_name)
        width = _FIXED_WIDTH.get(name)
        if width is not None:
            self.skip(rows * width)
        elif name == "String":
            self._strings(rows)
        elif name == "FixedString":
            self.skip(rows * int(args[0]))
        elif name == "Decimal":
            self.skip(rows * _decimal_width(int(args[0])))
        elif name.startswith("Interval"):
            self.skip(rows * 8)
        elif name == "Nullable":
            self.skip(rows)                   # the null map
            self.data(args[0], rows)
        elif name in ("Array", "Map"):
            self.skip(8 * (rows - 1))         # offsets: the last one is the nested values' count
            values = self.uint64()
            if name == "Array":
                self.data(args[0], values)
            else:
                self.data(args[0], values)
                self.data(args[1], values)
        elif name == "Tuple":
            for argument in args:
                self.data(_element_type(argument), rows)
        elif name == "SimpleAggregateFunction":
            self.data(args[1], rows)
        elif name in _GEO:
            self.data(_GEO[name], rows)
        elif name == "LowCardinality":
            self._low_cardinality(args[0])
        else:
            raise UnsupportedNative(f"a {type_name} column cannot be sent in Native to a client that names its "
                                    "protocol revision: use another format")

    def _strings(self, rows: int) -> None:
        # The answer's hot loop (a String column is walked value by value): kept to an index and an add per value.
        data, pos = self.buf, self.pos
        try:
            for _ in range(rows):
                size = data[pos]
                if size < 0x80:       # most strings are shorter than 128 bytes: a one-byte length
                    pos += size + 1
                else:
                    self.pos = pos
                    size = self.varint()
                    pos = self.pos + size
        except IndexError:
            raise UnsupportedNative("the Native answer ended inside a column") from None
        self.pos = pos
        if pos > len(data):
            raise UnsupportedNative("the Native answer ended inside a column")

    def _low_cardinality(self, values_type: str) -> None:
        index_type = self.uint64()
        if index_type & _LC_GLOBAL_DICTIONARY:
            raise UnsupportedNative("a LowCardinality column with a shared dictionary cannot be rewritten")
        if index_type & _LC_ADDITIONAL_KEYS:
            keys = self.uint64()
            name, args = split_type(values_type)
            self.data(args[0] if name == "Nullable" else values_type, keys)   # the dictionary is never Nullable
        indexes = self.uint64()
        self.skip(indexes * _LC_INDEX_WIDTH[index_type & 0xFF])
