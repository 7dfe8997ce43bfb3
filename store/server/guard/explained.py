"""DESCRIBE, EXISTS and SHOW CREATE, which ``parseQueryToJSON`` cannot give as JSON: read from ``EXPLAIN AST``, line by
line; only a table name may follow them."""

from __future__ import annotations

from store.server.guard.policy import STATEMENTS
from store.server.guard.refusal import refuse
from store.server.guard.walk import Verdict, check_format, label

_EXPLAINED_ROOTS = {
    "DescribeQuery": "DESCRIBE", "ExistsTableQuery": "EXISTS", "ExistsDatabaseQuery": "EXISTS",
    "ExistsViewQuery": "EXISTS", "ExistsDictionaryQuery": "EXISTS", "ShowCreateTableQuery": "SHOW CREATE",
    "ShowCreateViewQuery": "SHOW CREATE", "ShowCreateDatabaseQuery": "SHOW CREATE",
}


def check_explained(text: str, unsupported: str) -> Verdict:
    """Allow DESCRIBE/EXISTS/SHOW CREATE of a table (name only) from their ``EXPLAIN AST`` lines.

    Each AST node is one line, its type first; a name holding a line break can only add lines, and every line
    must be of an allowed type, so such a name makes the statement refused, never allowed.
    """
    lines = [line for line in text.split("\n") if line.strip()]
    if not lines:
        raise refuse("the statement could not be checked")
    root = lines[0].split(" ", 1)[0]
    if root not in _EXPLAINED_ROOTS:
        if root in STATEMENTS:
            # An allowed kind of statement holding a part the parser cannot give as JSON (``unsupported`` names it):
            # what the guard cannot see, it does not let through.
            start = unsupported.find("AST node of type '")
            end = unsupported.find("'", start + 18) if start >= 0 else -1
            part = unsupported[start + 18:end] if end > start >= 0 else "a part"
            raise refuse(f"{label(root)} with {part} is not allowed: the guard cannot inspect it")
        raise refuse(f"{label(root)} is not allowed")
    allowed = {"Identifier", "TableIdentifier"} | ({"TableExpression"} if root == "DescribeQuery" else set())
    fmt: str | None = None
    names: list[str] = []      # the root's Identifier children: the names, then the FORMAT clause's, if any
    for line in lines[1:]:
        stripped = line.lstrip(" ")
        depth = len(line) - len(stripped)
        node_type, _, rest = stripped.partition(" ")
        if node_type not in allowed:
            what = {"Literal": "INTO OUTFILE", "Set": "SETTINGS", "Function": "a function"}.get(node_type, node_type)
            raise refuse(f"{_EXPLAINED_ROOTS[root]} accepts a table name only ({what} is not allowed here)")
        if node_type == "Identifier" and depth == 1:
            names.append(rest)
    if root == "DescribeQuery":
        if names:
            fmt = check_format(names[-1].strip())
    elif names:
        fmt = _explained_format(lines[0], root, names)
    return Verdict(kind="select", statement=root, read_only=True, format=fmt)


def _explained_format(head: str, root: str, names: list[str]) -> str | None:
    """The FORMAT of EXISTS/SHOW CREATE from ``EXPLAIN AST``: the root line prints ``<type> <database> <table>
    (children N)`` and the children are the names given, then the format's. Whichever reading reproduces the root
    line is the statement's; a format is allow-listed."""
    count = f"(children {len(names)})"
    database_only = root in ("ExistsDatabaseQuery", "ShowCreateDatabaseQuery")
    readings = []
    for has_format in (False, True):
        given = names[:-1] if has_format else names
        if database_only:
            database, table = (given[0], "") if len(given) == 1 else (None, None)
        else:
            database, table = (given[0], given[1]) if len(given) == 2 else ("", given[0]) if len(given) == 1 \
                else (None, None)
        if database is not None and head == f"{root} {database} {table} {count}":
            readings.append(has_format)
    if len(readings) != 1:
        raise refuse(f"{_EXPLAINED_ROOTS[root]}: the statement could not be checked")
    return check_format(names[-1].strip()) if readings[0] else None
