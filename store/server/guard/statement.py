"""The guard's entry: :func:`check` has ClickHouse's parser turn one statement into its AST (one chDB call,
``parseQueryToJSON``) and the walk judge it."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from store.server.guard.explained import check_explained
from store.server.guard.policy import Role
from store.server.guard.refusal import (
    BAD_ARGUMENTS,
    QUERY_IS_TOO_LARGE,
    SYNTAX_ERROR,
    TOO_DEEP_RECURSION,
    Refused,
    clickhouse_error,
)
from store.server.guard.walk import Verdict, Walk

#: ClickHouse's default ``max_query_size`` (bytes of statement text the parser accepts).
DEFAULT_MAX_QUERY_SIZE = 262_144


def check(statement: str, *, role: Role, parse: Callable[[str], str], caps: Mapping[str, float] | None = None,
          max_query_size: int = DEFAULT_MAX_QUERY_SIZE) -> Verdict:
    """Decide whether ``role`` may run ``statement``; raise :class:`Refused` if not.

    ``statement``: the SQL text as the client sent it; for an insert whose data is the request body, the text up
    to and including ``FORMAT <name>`` (or ``VALUES``). An insert with its data in the text is refused.
    ``parse(sql)`` runs ``sql`` on chDB and returns its TabSeparatedRaw text, raising the ClickHouse error
    (``Code: N. DB::Exception: ... (NAME)``) otherwise; other exceptions pass through unchanged.
    ``caps``: setting name → the highest value a statement's SETTINGS may give it (0, unlimited, is above every
    cap). ``max_query_size``: longer statements are refused (QUERY_IS_TOO_LARGE) before anything parses them.
    """
    if role not in ("reader", "writer"):
        raise ValueError(f"role must be 'reader' or 'writer', got {role!r}")
    literal = _literal(statement, max_query_size)
    # The wrapper adds the quotes and escapes; the parser inside is held to the same limit by the check above.
    limit = f" SETTINGS max_query_size = {2 * max_query_size + 4096}"
    inline = False
    try:
        # toValidUTF8: a literal such as '\xFF' is a byte the JSON would carry raw; the parse returns text.
        tree = _load(_call(parse, f"SELECT toValidUTF8(parseQueryToJSON({literal})){limit}"))
    except Refused as error:
        if error.code != BAD_ARGUMENTS[0]:
            raise
        if "inline data" in error.message:
            # formatQuery keeps the statement and drops the data that followed it.
            tree = _load(_call(parse, f"SELECT toValidUTF8(parseQueryToJSON(formatQuery({literal}))){limit}"))
            inline = True
        elif "does not support JSON serialization" in error.message:
            return check_explained(_call(parse, f"EXPLAIN AST {statement}"), error.message)
        else:
            raise
    verdict = Walk(role, caps or {}).statement(tree)
    if inline:
        # chDB runs the text as a script: the Values format's data ends at a `;`, and whatever follows runs as
        # the next statement (`VALUES (1); DROP TABLE t`), which no parse of the statement sees.
        raise Refused(*BAD_ARGUMENTS, "INSERT with its data inside the statement is not allowed: send "
                                      "`INSERT INTO t FORMAT Values` (or another format) and the rows after it, "
                                      "as the request body")
    return verdict


def _literal(statement: str, max_query_size: int) -> str:
    """The statement as a ClickHouse string literal, after the size and encoding checks."""
    too_large = f"the statement is longer than max_query_size ({max_query_size} bytes)"
    if len(statement) > max_query_size:
        raise Refused(*QUERY_IS_TOO_LARGE, too_large)
    try:
        size = len(statement.encode("utf-8"))
    except UnicodeEncodeError:
        raise Refused(*BAD_ARGUMENTS, "the statement is not valid UTF-8") from None
    if size > max_query_size:
        raise Refused(*QUERY_IS_TOO_LARGE, too_large)
    if "\0" in statement:
        # A NUL may end the text early in a C API; the statement parsed must be the statement run.
        raise Refused(*SYNTAX_ERROR, "the statement contains a NUL character")
    if not statement.strip():
        raise Refused(*SYNTAX_ERROR, "Empty query")
    return "'" + statement.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _load(text: str) -> dict[str, Any]:
    try:
        tree = json.loads(text)
    except RecursionError:
        raise Refused(*TOO_DEEP_RECURSION, "the statement nests too deeply to be checked") from None
    if not isinstance(tree, dict):
        raise Refused(*SYNTAX_ERROR, "the statement could not be parsed")
    return tree


def _call(parse: Callable[[str], str], sql: str) -> str:
    """``parse(sql)``, a ClickHouse error raised as :class:`Refused` with its own code and name."""
    try:
        return parse(sql)
    except UnicodeDecodeError:
        # EXPLAIN AST prints names as they are: a name that is not UTF-8 cannot be read back as text.
        raise Refused(*BAD_ARGUMENTS, "the statement names something in bytes that are not UTF-8") from None
    except Exception as error:
        refused = clickhouse_error(str(error))
        if refused is None:
            raise
        raise refused from None
