"""One pass over a statement's JSON AST (from ``parseQueryToJSON``), refusing as it goes what the policy does not
allow and collecting what the server needs to run the rest (:class:`Verdict`); and the checks of a setting and a
format the server also applies to URL parameters."""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from store.server.guard.policy import (
    ALTER_COMMANDS,
    BACKGROUND_NODES,
    CREATE_FLAGS,
    DATABASE_ENGINES,
    DENIED_FORMATS,
    DENIED_SETTINGS,
    FORMATS,
    HOST_FUNCTIONS,
    HOST_TABLE_FUNCTIONS,
    INSERT_TABLE_FUNCTIONS,
    KNOWN_TABLE_FUNCTIONS,
    NODE_TYPES,
    PROTECTED_DATABASES,
    READER_SYSTEM_TABLES,
    SCALAR_TABLE_FUNCTION_NAMES,
    STATEMENTS,
    SYSTEM_PATH_COLUMNS,
    SYSTEM_TABLES_WITH_PATHS,
    TABLE_ENGINES,
    TABLE_FUNCTIONS,
    TABLE_SETTINGS,
    WRITER_STATEMENTS,
    Kind,
    Role,
    is_database_name,
)
from store.server.guard.refusal import (
    ACCESS_DENIED,
    READONLY,
    SETTING_CONSTRAINT_VIOLATION,
    UNKNOWN_FORMAT,
    Refused,
    refuse,
)


@dataclass(frozen=True)
class Verdict:
    """What the server needs to run an allowed statement.

    ``kind``: ``select`` answers with a result set (SELECT, SHOW, DESCRIBE, EXISTS, EXPLAIN, CHECK); ``insert``
    writes into ``insert_table``; ``ddl`` is any other writer statement, answered without a result (CREATE, ALTER,
    DROP, TRUNCATE, RENAME, OPTIMIZE, DELETE, UPDATE). ``read_only``: the statement changes nothing.
    ``format``: the FORMAT clause (for an insert, the format of its data; for a select, of its result), or None.
    ``expects_data``: an insert whose data is the request body (no SELECT, or a SELECT from ``input()``).
    ``settings``: the query-level SETTINGS clauses found in the statement (subqueries and views included), name →
    literal value, already checked against the caps and the denied settings.
    """

    kind: Kind
    statement: str
    read_only: bool
    insert_database: str | None = None
    insert_table: str | None = None
    format: str | None = None
    expects_data: bool = False
    settings: Mapping[str, Any] = field(default_factory=dict)


def check_settings(settings: Mapping[str, Any], caps: Mapping[str, float] | None = None) -> None:
    """Refuse settings a client may not change (URL parameters, for instance): ``readonly``, those that name
    files, URLs or dialects or undo :data:`ENFORCED_SETTINGS`, and values above ``caps``."""
    for name, value in settings.items():
        _check_setting(name, value, caps or {})


def check_format(name: str) -> str:
    """Refuse a format outside the allow-list (``default_format`` URL parameter, for instance); return it."""
    lower = name.lower()
    if lower in DENIED_FORMATS:
        raise refuse(f"format {name} is not allowed: {DENIED_FORMATS[lower]}")
    if lower not in FORMATS:
        raise Refused(*UNKNOWN_FORMAT, f"Unknown format {name}")
    return name


def _children(node: Any) -> Iterator[tuple[str, Any]]:
    if isinstance(node, dict):
        yield from node.items()
    elif isinstance(node, list):
        for item in node:
            yield "", item


_ALL_COLUMNS = frozenset({"Asterisk", "QualifiedAsterisk", "ColumnsRegexpMatcher", "ColumnsListMatcher",
                          "QualifiedColumnsRegexpMatcher", "QualifiedColumnsListMatcher"})


class Walk:
    """One pass over a statement's JSON AST, refusing as it goes and collecting what the Verdict needs."""

    def __init__(self, role: Role, caps: Mapping[str, float]) -> None:
        self.role = role
        self.caps = caps
        self.settings: dict[str, Any] = {}
        self.stored = False    # a CREATE or ALTER: what it holds is kept and may run later, in the background
        self.reads_system = False      # a system table is read (the reader's column rules apply)
        self.reads_paths = False       # one of SYSTEM_TABLES_WITH_PATHS is read
        self.all_columns = False       # ``*`` or a COLUMNS matcher
        self.path_column = ""          # a column named like one of SYSTEM_PATH_COLUMNS

    def statement(self, root: dict[str, Any]) -> Verdict:
        kind, read_only, name = self._root(root)
        inner = root["query"] if name == "ExplainQuery" else root
        self.stored = inner.get("type") in ("CreateQuery", "AlterQuery")
        uses_input = self._walk(root)
        # After the walk, so that a statement refused for everyone says why, whichever the role.
        self._role(root)
        if self.reads_system and self.role == "reader":
            if self.all_columns and self.reads_paths:
                raise refuse("all columns of a system table are not allowed for the reader (some name host paths): "
                             "name the columns")
            if self.path_column:
                raise refuse(f"column {self.path_column} of a system table is not allowed for the reader: it names "
                             "a host path")
        if not STATEMENTS[str(inner.get("type"))][1]:
            _check_write(inner)
        verdict = Verdict(kind=kind, statement=name, read_only=read_only, settings=dict(self.settings))
        if name == "InsertQuery":
            fmt = root.get("format") or None
            if fmt is not None:
                check_format(fmt)
            verdict = Verdict(kind=kind, statement=name, read_only=False, settings=dict(self.settings),
                              insert_database=_name(root.get("database")), insert_table=_name(root.get("table")),
                              format=fmt, expects_data=root.get("select") is None or uses_input)
        else:
            fmt = _name(root.get("format_ast"))
            if fmt is not None:
                check_format(fmt)
                verdict = Verdict(**{**verdict.__dict__, "format": fmt})
        return verdict

    def _root(self, root: dict[str, Any]) -> tuple[Kind, bool, str]:
        name = root.get("type")
        if name == "ExplainQuery":
            inner = root.get("query")
            if not isinstance(inner, dict):
                raise refuse("EXPLAIN without a statement is not allowed")
            self._root(inner)
            return "select", True, name
        if name not in STATEMENTS:
            raise refuse(_statement_refusal(root))
        kind, read_only = STATEMENTS[name]
        return kind, read_only, name

    def _role(self, root: dict[str, Any]) -> None:
        name = str(root.get("type"))
        if name == "ExplainQuery" and isinstance(root.get("query"), dict):
            self._role(root["query"])
        elif not STATEMENTS[name][1] and self.role != "writer":
            raise Refused(*READONLY, f"Cannot execute {label(name)} in readonly mode: the reader credential "
                                     "may only read")

    def _walk(self, root: dict[str, Any]) -> bool:
        """Check every node; return whether the statement reads ``input()``."""
        uses_input = False
        in_insert = root.get("type") == "InsertQuery" or (
            root.get("type") == "ExplainQuery" and isinstance(root.get("query"), dict)
            and root["query"].get("type") == "InsertQuery")
        # (node, its key in the parent, the parent's type, whether it is a statement root, whether it is part of a
        # table's definition or an ALTER command: evaluated later, in the background)
        stack: list[tuple[Any, str, str | None, bool, bool]] = [(root, "", None, True, False)]
        while stack:
            node, key, parent, is_root, background = stack.pop()
            if isinstance(node, dict) and "type" in node and isinstance(node["type"], str):
                self._node(node, key, parent, is_root)
                node_type = node["type"]
                if background:
                    _check_background(node)
                if node_type == "Function" and str(node.get("name", "")).lower() == "input":
                    if not in_insert:
                        raise refuse("table function input is only allowed in INSERT ... SELECT")
                    uses_input = True
                below = background or node_type in BACKGROUND_NODES
                for child_key, child in node.items():
                    if isinstance(child, dict | list):   # scalars hold nothing to check
                        child_root = node_type == "ExplainQuery" and child_key == "query"
                        stack.append((child, child_key, node_type, child_root, below))
            else:
                for child_key, child in _children(node):
                    if isinstance(child, dict | list):
                        stack.append((child, child_key or key, parent, False, background))
        return uses_input

    def _node(self, node: dict[str, Any], key: str, parent: str | None, is_root: bool) -> None:
        node_type = node["type"]
        if node_type in STATEMENTS and node_type != "SelectWithUnionQuery" and not is_root:
            raise refuse(f"{label(node_type)} inside another statement is not allowed")
        if node_type not in STATEMENTS and node_type not in NODE_TYPES:
            raise refuse(f"{label(node_type)} is not allowed")
        if node.get("out_file") is not None:
            raise refuse("INTO OUTFILE is not allowed: it writes a host file")
        if node.get("infile") is not None:
            raise refuse("FROM INFILE is not allowed: it reads a host file")
        if node.get("is_into_outfile_with_stdout"):
            raise refuse("INTO OUTFILE is not allowed: it writes a host file")
        if node_type == "Function":
            self._function(node, key, parent)
        elif node_type == "TableIdentifier":
            self._table(node)
        elif node_type in _ALL_COLUMNS:
            self.all_columns = True
        elif node_type == "Identifier" and self.role == "reader":
            column = str(node.get("name", "")).rsplit(".", 1)[-1].lower()
            if column in SYSTEM_PATH_COLUMNS:
                self.path_column = column
        elif node_type == "SetQuery":
            self._set(node, key, parent)
        elif node_type == "InsertQuery" and node.get("table_function") is not None:
            raise refuse("INSERT INTO FUNCTION is not allowed: insert into a table")
        elif node_type == "CreateQuery":
            self._create(node)
        elif node_type == "AlterQuery":
            if node.get("alter_object") != "TABLE":
                raise refuse(f"ALTER {node.get('alter_object')} is not allowed")
        elif node_type == "AlterCommand":
            command = node.get("command_type")
            if command not in ALTER_COMMANDS:
                raise refuse(f"ALTER TABLE {str(command).replace('_', ' ')} is not allowed")
        elif node_type == "DropQuery":
            drop_kind = node.get("kind")
            if drop_kind not in ("Drop", "Truncate"):
                raise refuse(f"{str(drop_kind).upper()} is not allowed")
            if node.get("is_dictionary") or node.get("temporary") or node.get("is_temporary"):
                raise refuse("dictionaries and temporary tables are not allowed")
        elif node_type == "RenameQuery" and node.get("dictionary"):
            raise refuse("dictionaries are not allowed")

    def _table(self, node: dict[str, Any]) -> None:
        """A table a statement names: for the reader, a system table only of :data:`READER_SYSTEM_TABLES`."""
        parts = [str(p) for p in node.get("name_parts") or str(node.get("name", "")).split(".")]
        if len(parts) == 2 and parts[0].lower() == "system":
            self.reads_system = True
            self.reads_paths = self.reads_paths or parts[1].lower() in SYSTEM_TABLES_WITH_PATHS
            if self.role == "reader" and parts[1].lower() not in READER_SYSTEM_TABLES:
                raise Refused(*ACCESS_DENIED, f"system.{parts[1][:100]} is not readable by the reader: it shows the "
                                              "host or other users' work, not the data")

    def _function(self, node: dict[str, Any], key: str, parent: str | None) -> None:
        name = str(node.get("name", ""))
        kind = node.get("kind")
        if kind == "TABLE_ENGINE" or (parent == "Storage" and key == "engine" and kind != "DATABASE_ENGINE"):
            if name not in TABLE_ENGINES:
                raise refuse(f"table engine {name} is not allowed: it reaches the host or other servers "
                              f"(allowed: {', '.join(sorted(TABLE_ENGINES))})")
            return
        if kind == "DATABASE_ENGINE":
            if name not in DATABASE_ENGINES:
                raise refuse(f"database engine {name} is not allowed: it reaches the host or other servers "
                              f"(allowed: {', '.join(sorted(DATABASE_ENGINES))})")
            return
        if kind not in (None, "ORDINARY_FUNCTION", "WINDOW_FUNCTION", "LAMBDA_FUNCTION", "CODEC", "STATISTICS"):
            raise refuse(f"function {name} ({kind}) is not allowed")
        lower = name.lower()
        table_position = key in ("table_function", "as_table_function")
        if not table_position and lower in HOST_FUNCTIONS:
            raise refuse(f"function {name} is not allowed: it {HOST_FUNCTIONS[lower]}")
        if table_position or (lower in KNOWN_TABLE_FUNCTIONS and lower not in SCALAR_TABLE_FUNCTION_NAMES):
            if lower not in TABLE_FUNCTIONS and lower not in INSERT_TABLE_FUNCTIONS:
                why = "it reaches the host" if lower.startswith(HOST_TABLE_FUNCTIONS) else "not on the allow-list"
                raise refuse(f"table function {name} is not allowed: {why} "
                              f"(allowed: {', '.join(sorted(TABLE_FUNCTIONS))})")
            if lower == "merge" and self.role == "reader":
                raise Refused(*ACCESS_DENIED, "table function merge is not allowed for the reader: it reads tables "
                                              "by pattern, the system ones too; name the tables")
            if lower == "format":
                if self.stored:
                    raise refuse("table function format is not allowed in CREATE or ALTER: what a table or view "
                                  "keeps may run later, where the request's settings do not apply")
                _check_format_argument(node)
            return
        if lower.startswith("__"):
            raise refuse(f"function {name} is not allowed: it is internal")

    def _set(self, node: dict[str, Any], key: str, parent: str | None) -> None:
        changes = node.get("changes") or []
        if node.get("is_standalone"):
            raise refuse("SET is not allowed: settings come from URL parameters, per request")
        if parent == "ExplainQuery" and key == "settings":
            return   # EXPLAIN's own options (header = 1, json = 1, ...), not settings
        table_level = (parent in ("Storage", "ColumnDeclaration") and key == "settings") or (
            parent == "AlterCommand" and key == "settings_changes")
        for change in changes:
            if not isinstance(change, dict):
                continue
            name = str(change.get("name", ""))
            value = _field(change.get("value"))
            if table_level:
                if name not in TABLE_SETTINGS:
                    raise refuse(f"table setting {name} is not allowed")
                if isinstance(value, _Custom):
                    raise refuse(f"table setting {name}: only a literal value is allowed")
            else:
                _check_setting(name, value, self.caps)
                self.settings[name] = value

    def _create(self, node: dict[str, Any]) -> None:
        if node.get("refresh_strategy") is not None:
            raise refuse("a refreshable materialized view (REFRESH EVERY/AFTER) is not allowed: its refreshes run "
                          "in the background, outside every setting and limit of the request")
        if node.get("replace_table") or node.get("create_or_replace") or (
                node.get("replace_view") and not node.get("is_ordinary_view")):
            raise refuse("CREATE OR REPLACE / REPLACE is not allowed but for a plain VIEW: it drops what it replaces")
        if node.get("is_temporary") or node.get("temporary"):
            raise refuse("temporary tables are not allowed: they would outlive the request on a pooled connection")
        if node.get("attach"):
            raise refuse("ATTACH is not allowed")
        if node.get("has_attach_from_path") or node.get("attach_from_path"):
            raise refuse("ATTACH ... FROM path is not allowed: it reads host files")
        if node.get("is_dictionary"):
            raise refuse("CREATE DICTIONARY is not allowed: dictionary sources reach the host")
        for flag, value in node.items():
            if value is True and flag not in CREATE_FLAGS and not flag.startswith("is_outfile"):
                if flag in ("has_uuid", "has_uuid_clause", "has_inner_uuid_clause"):
                    continue
                raise refuse(f"CREATE with {flag} is not allowed")


def _check_format_argument(node: dict[str, Any]) -> None:
    """``format(<format>, [<structure>,] <data>)``: the format is a name or a string the guard reads, and is
    allow-listed (``format(Protobuf, ...)``); the structure and the data are string literals. A query parameter,
    an expression or a subquery in their place would be read by chDB only, after the guard."""
    arguments = node.get("arguments")
    children = arguments.get("children") if isinstance(arguments, dict) else None
    if not isinstance(children, list) or len(children) < 2 or not all(isinstance(c, dict) for c in children):
        raise refuse("table function format needs its format and its data as literals")
    first = children[0]
    if first.get("type") == "Identifier" and isinstance(first.get("name"), str) and first["name"] \
            and not first.get("children"):
        check_format(first["name"])
    elif first.get("type") == "Literal" and isinstance(_field(first.get("value")), str):
        check_format(_field(first.get("value")))
    else:
        raise refuse("table function format: its format must be a name written in the statement (not a query "
                      "parameter or an expression)")
    for argument in children[1:]:
        if argument.get("type") != "Literal" or not isinstance(_field(argument.get("value")), str):
            raise refuse("table function format: its structure and data must be string literals written in the "
                          "statement (not a query parameter, an expression or a subquery)")


def _check_background(node: dict[str, Any]) -> None:
    """A node of a table's definition or of an ALTER command: chDB evaluates these later (merges, TTL, mutations)
    in its background context, where the request's settings and limits do not apply."""
    node_type = node["type"]
    if node_type in ("Subquery", "SelectWithUnionQuery", "SelectQuery"):
        raise refuse("a subquery is not allowed in a table's definition or an ALTER command: it would run in the "
                      "background, outside the request's limits")
    if node_type == "QueryParameter":
        raise refuse("a query parameter is not allowed in a table's definition or an ALTER command: what is kept "
                      "must be written in the statement")
    if node_type == "Function":
        lower = str(node.get("name", "")).lower()
        if lower in KNOWN_TABLE_FUNCTIONS and lower not in SCALAR_TABLE_FUNCTION_NAMES:
            raise refuse(f"table function {node.get('name')} is not allowed in a table's definition or an ALTER "
                          "command: it would run in the background, outside the request's limits")


def _written_databases(root: dict[str, Any]) -> Iterator[str]:
    """The databases a writing statement names as what it creates, alters, writes or drops ("" when unqualified:
    the request's database)."""
    database = root.get("database")
    if isinstance(database, str):
        yield database
    elif isinstance(database, dict):
        yield _name(database) or ""
    named = _name(root.get("database_ast"))
    if named is not None:
        yield named
    targets = root.get("targets")
    for target in (targets.get("targets") if isinstance(targets, dict) else None) or ():
        if isinstance(target, dict) and isinstance(target.get("table_database"), str):
            yield target["table_database"]
    for element in root.get("elements") or ():
        if isinstance(element, dict):
            yield from (str(element.get(k) or "") for k in ("from_database", "to_database"))


def _check_write(root: dict[str, Any]) -> None:
    """A writing statement (any role that got this far): a kind the writer may run, never into the engine's own
    databases, and a new database with a plain name."""
    name = str(root.get("type"))
    if name not in WRITER_STATEMENTS:
        raise refuse(f"{label(name)} is not allowed: the writer runs the statements the product sends (INSERT, "
                      "CREATE DATABASE/TABLE/VIEW/MATERIALIZED VIEW, ALTER TABLE, OPTIMIZE)")
    for database in _written_databases(root):
        if database.lower() in PROTECTED_DATABASES:
            raise refuse(f"{label(name)} in database {database} is not allowed: it is the engine's own")
    if name == "CreateQuery" and not root.get("table") and isinstance(root.get("database"), str) \
            and not is_database_name(root["database"]):
        raise refuse(f"database name {root['database'][:100]!r} is not allowed: a database's name is a plain "
                      "identifier (letters, digits, _)")


class _Custom(str):
    """A setting value the parser kept as an expression (``disk(...)``, ``{param:Type}``)."""


def _field(value: Any) -> Any:
    if isinstance(value, dict) and "field_type" in value:
        if value["field_type"] == "CustomType":
            return _Custom(value.get("value", ""))
        return value.get("value")
    return value


def _check_setting(name: str, value: Any, caps: Mapping[str, float]) -> None:
    lower = name.lower()
    if lower == "readonly":
        raise Refused(*READONLY, "Cannot modify 'readonly' setting: it is the server's to set")
    if lower in DENIED_SETTINGS or "dialect" in lower or lower.endswith("_path") or lower.endswith("_url"):
        raise refuse(f"setting {name} may not be changed")
    if isinstance(value, _Custom):
        raise refuse(f"setting {name}: only a literal value is allowed")
    cap = caps.get(name)
    if cap is None:
        return
    number = _number(value)
    if number is None:
        raise Refused(*SETTING_CONSTRAINT_VIOLATION, f"Setting {name} should be a number not greater than {cap}")
    if number == 0 or number > cap or number < 0:
        shown = "0 (unlimited)" if number == 0 else f"{value}"
        raise Refused(*SETTING_CONSTRAINT_VIOLATION, f"Setting {name} shouldn't be greater than {cap} "
                                                     f"(asked for {shown})")


def _number(value: Any) -> float | None:
    """A finite number from a setting's literal (a number, or a string holding one), else None."""
    number: float | None = None
    if isinstance(value, bool | int | float):
        number = float(value)
    elif isinstance(value, str):
        try:
            number = float(value.strip())
        except ValueError:
            return None
    return number if number is not None and math.isfinite(number) else None


def _name(node: Any) -> str | None:
    if isinstance(node, dict) and node.get("type") == "Identifier" and isinstance(node.get("name"), str):
        return node["name"] or None
    return None


def label(node_type: str) -> str:
    """A readable statement name from an AST node type: ``SystemQuery`` → ``SYSTEM``."""
    known = {
        "SetQuery": "SET", "UseQuery": "USE", "SystemQuery": "SYSTEM", "KillQueryQuery": "KILL",
        "BackupQuery": "BACKUP/RESTORE", "TransactionControl": "transactions (BEGIN/COMMIT/ROLLBACK)",
        "CreateSQLFunctionQuery": "CREATE FUNCTION", "DropFunctionQuery": "DROP FUNCTION",
        "InsertQuery": "INSERT", "CreateQuery": "CREATE", "AlterQuery": "ALTER", "DropQuery": "DROP/TRUNCATE",
        "RenameQuery": "RENAME/EXCHANGE", "OptimizeQuery": "OPTIMIZE", "DeleteQuery": "DELETE",
        "UpdateQuery": "UPDATE", "CreateIndexQuery": "CREATE INDEX", "DropIndexQuery": "DROP INDEX",
        "FunctionWithKeyValueArguments": "a key-value source", "Dictionary": "a dictionary",
    }
    return known.get(node_type, node_type)


def _statement_refusal(root: dict[str, Any]) -> str:
    name = str(root.get("type"))
    if name == "SetQuery":
        return "SET is not allowed: settings come from URL parameters, per request"
    if name == "UseQuery":
        return "USE is not allowed: name the database in the statement or the `database` URL parameter"
    return f"{label(name)} is not allowed"
