"""The statement guard of the embedded store: what a ClickHouse server's access control would refuse, decided
from ClickHouse's own parser.

chDB is clickhouse-local in process: it has no users, grants, ``readonly`` profile or ``user_files_path``, so any
SQL that reaches it may read or write host files (``file()``, ``INTO OUTFILE``, ``FROM INFILE``, engines ``File``,
``URL``, ``Executable``, ``ENGINE = Filesystem`` databases), reach the network (``url()``, ``s3``, ``remote``,
``ai*`` functions), read the server process's Python objects (chDB's ``Python()`` table function) or change the
state of the pooled connection for later requests (``USE``, ``SET``, temporary tables, multi-statements).
:func:`check` decides, before a statement runs, whether a role may run it.

How it decides
--------------
One chDB call, ``SELECT parseQueryToJSON('<statement>')``, has ClickHouse's parser turn the statement into its
AST as JSON (every clause a named member: ``out_file``, ``infile``, ``table_function``, ``settings_ast``, ...).
The parser also refuses multi-statements (``SELECT 1; USE system`` → SYNTAX_ERROR), which ``EXPLAIN AST`` would
not (it reads only the first statement). The JSON is then walked without recursion and every decision is an
allow-list:

- the statement kind per role: a ``reader`` runs SELECT/WITH/UNION, SHOW, DESCRIBE, EXISTS, SHOW CREATE, CHECK
  and EXPLAIN of those; a ``writer`` also what the product sends (``_WRITER_STATEMENTS``: the job's and the
  evaluator's inserts, the migrations' CREATE DATABASE/TABLE/VIEW/MATERIALIZED VIEW and ALTER TABLE, OPTIMIZE),
  with ALTER TABLE limited to the commands in ``_ALTER_COMMANDS``. DROP, TRUNCATE, RENAME/EXCHANGE, DELETE,
  UPDATE, CREATE/DROP INDEX, CREATE OR REPLACE and everything else (SET, USE, SYSTEM, KILL, BACKUP/RESTORE,
  ATTACH/DETACH, GRANT, CREATE USER/ROLE/FUNCTION/DICTIONARY, transactions, temporary tables, ...) are refused
  for everyone; no statement writes into ``system`` or ``information_schema`` (``PROTECTED_DATABASES``), and a
  database the writer creates has a plain identifier for a name (:func:`is_database_name`);
- nothing that runs later in chDB's background, where the request's settings and limits do not apply: no
  refreshable materialized view (``REFRESH EVERY/AFTER``), no subquery or table function in a table's
  definition (columns, TTL, keys) or in an ALTER (mutations run in the background), no ``format()`` table
  function in a CREATE or ALTER; elsewhere ``format()`` must name its format and give its data as string
  literals the guard reads (not a query parameter, an expression or a subquery);
- the AST node types (``_NODE_TYPES``): a construct the guard has not been taught is refused, not passed;
- table functions (``_TABLE_FUNCTIONS``), wherever a function of that name appears; ``input`` only inside an
  INSERT; table engines (``_TABLE_ENGINES``: MergeTree family, Memory, Null, Log family, Set, Join, Merge — not
  Distributed/Buffer/Replicated*, which reach other hosts or ZooKeeper) and database engines (Atomic, Memory);
- table-level engine settings (``_TABLE_SETTINGS``: ``disk``/``storage_policy`` would put parts anywhere);
- formats (``_FORMATS``: no Protobuf/CapnProto, which read a schema file, no AvroConfluent, which fetches one).

Deny-lists remain where an allow-list is impractical: scalar functions (about 1,700 of them) refuse those that
reach the host or the network (``_HOST_FUNCTIONS``, from ``system.functions``: ``file``, ``catboostEvaluate``,
the ``ai*`` functions, introspection, ...), and query settings refuse those that name files, URLs or parsing
dialects, that carry SQL evaluated later (``additional_table_filters``) or that would undo
:data:`ENFORCED_SETTINGS` (``_DENIED_SETTINGS``). ``readonly`` can never be changed (READONLY), and the settings
named in ``caps`` never exceed their cap (a ClickHouse settings-profile ``max`` constraint; ``0``, unlimited,
counts as above every cap).

Three statement kinds the JSON form does not cover (DESCRIBE, EXISTS, SHOW CREATE) are read from a second call,
``EXPLAIN AST``, line by line: only a table name may follow them. An INSERT with inline data (``VALUES (...)``)
is parsed through ``formatQuery`` (which keeps the statement and drops the data) to name what it is, then refused:
chDB runs a text as a script, the ``Values`` data ends at a ``;`` and what follows would run as a second statement
that no parse of the first sees. The data goes in the request body, after ``INSERT ... FORMAT <name>``, and never
into SQL text. The ``Values`` format also evaluates expressions in its data (``(file('/etc/passwd'))`` reads the
file, in a body as in ``format(Values, ...)``): :data:`ENFORCED_SETTINGS` turn that off and must be applied by the
server to every query.

What the server does with a :class:`Verdict`: run the statement text it checked, on a handle with its caps and
:data:`ENFORCED_SETTINGS` set after the client's settings (URL parameters pass :func:`check_settings` and
``default_format`` :func:`check_format` first); ``kind == "insert"`` with ``expects_data``: the request body is the
data, in ``format``; ``select``: answer the result set (``format``, when the statement names one); ``ddl``: answer
empty. Tables of the ``system`` database stay readable, as for a ClickHouse user (clients read ``system.settings``).

Cost: one chDB call per statement (two for DESCRIBE/EXISTS/SHOW CREATE and inline-data inserts, or a refusal
that names its node); no regular expression reads the user's text; the walk is linear in the AST.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

Role = Literal["reader", "writer"]
Kind = Literal["select", "insert", "ddl"]

#: ClickHouse's default ``max_query_size`` (bytes of statement text the parser accepts).
DEFAULT_MAX_QUERY_SIZE = 262_144

#: Settings the server applies to every query it runs, after the client's own, and which no statement may change
#: (they are in ``_DENIED_SETTINGS``): the ``Values`` input format evaluates SQL expressions found in the *data*
#: (``INSERT ... VALUES (file('/etc/passwd'))``, ``format(Values, ...)``), which no parse of the statement sees;
#: chDB's ``Python()`` table function reads the server process's Python objects.
ENFORCED_SETTINGS: Mapping[str, str] = {
    "input_format_values_interpret_expressions": "0",
    "input_format_values_deduce_templates_of_expressions": "0",
    "allow_python_table_function": "0",
}

ACCESS_DENIED = (497, "ACCESS_DENIED")
READONLY = (164, "READONLY")
SYNTAX_ERROR = (62, "SYNTAX_ERROR")
QUERY_IS_TOO_LARGE = (229, "QUERY_IS_TOO_LARGE")
SETTING_CONSTRAINT_VIOLATION = (452, "SETTING_CONSTRAINT_VIOLATION")
TOO_DEEP_RECURSION = (306, "TOO_DEEP_RECURSION")
BAD_ARGUMENTS = (36, "BAD_ARGUMENTS")
UNKNOWN_FORMAT = (73, "UNKNOWN_FORMAT")

# What ClickHouse's HTTP handler answers for these codes (exceptionCodeToHTTPStatus); anything else is a 400.
_HTTP_STATUS = {497: 403, 164: 403, 229: 413}
_MESSAGE_LIMIT = 2_000


class Refused(Exception):
    """A statement the guard does not let through, with the ClickHouse error it answers as."""

    def __init__(self, code: int, name: str, message: str) -> None:
        super().__init__(f"Code: {code}. DB::Exception: {message}. ({name})")
        self.code = code
        self.name = name
        self.message = message

    @property
    def http_status(self) -> int:
        """The HTTP status ClickHouse would answer with: 403 (access), 413 (too large) or 400."""
        return _HTTP_STATUS.get(self.code, 400)


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


# --- allow-lists ------------------------------------------------------------------------------------------------

def _words(text: str) -> frozenset[str]:
    return frozenset(word.lower() for word in text.split())


#: Table functions that reach nothing outside the store (compared in lower case).
_TABLE_FUNCTIONS = frozenset({
    "numbers", "numbers_mt", "zeros", "zeros_mt", "values", "generaterandom", "null", "view", "merge", "format",
    "generate_series", "generateseries", "primes",
})
#: Allowed only inside an INSERT (it reads the request body).
_INSERT_TABLE_FUNCTIONS = frozenset({"input"})

#: Every table function chDB 4.4 knows (system.table_functions, lower case): a function of one of these names is
#: judged as a table function wherever it appears. ``format`` and ``file`` are scalar functions too.
_KNOWN_TABLE_FUNCTIONS = _words(
    "SQLStandardValues arrowstream azureBlobStorage azureBlobStorageCluster bigquery cluster clusterAllReplicas cosn "
    "deltaLake deltaLakeAzure deltaLakeAzureCluster deltaLakeCluster deltaLakeLocal deltaLakeS3 deltaLakeS3Cluster "
    "dictionary eval executable file fileCluster filesystem format fuzzJSON fuzzQuery gcs generateRandom "
    "generateSeries generate_series hdfs hdfsCluster hudi hudiCluster iceberg icebergAzure icebergAzureCluster "
    "icebergCluster icebergHDFS icebergHDFSCluster icebergLocal icebergLocalCluster icebergS3 icebergS3Cluster input "
    "jdbc loop merge mergeTreeAnalyzeIndexes mergeTreeAnalyzeIndexesUUID mergeTreeCodecBlockCounts mergeTreeIndex "
    "mergeTreeProjection mergeTreeTextIndex mongodb mysql null numbers numbers_mt odbc oss paimon paimonAzure "
    "paimonAzureCluster paimonCluster paimonHDFS paimonHDFSCluster paimonLocal paimonS3 paimonS3Cluster postgresql "
    "primes prometheusQuery prometheusQueryRange python redis remote remoteSecure s3 s3Cluster sqlite timeSeriesData "
    "timeSeriesMetricFamilies timeSeriesMetrics timeSeriesSamples timeSeriesSelector timeSeriesTags url urlCluster "
    "values view viewExplain viewIfPermitted ytsaurus zeros zeros_mt")

#: Table functions (name prefixes) that read or write host files, the network, other servers or processes.
_HOST_TABLE_FUNCTIONS = (
    "file", "url", "s3", "hdfs", "azure", "gcs", "cosn", "oss", "iceberg", "deltalake", "hudi", "paimon", "remote",
    "cluster", "mysql", "postgresql", "mongodb", "redis", "sqlite", "jdbc", "odbc", "executable", "python",
    "filesystem", "ytsaurus", "bigquery", "prometheus", "arrow", "eval", "dictionary",
)

#: Scalar functions that are also table-function names and harmless as scalars.
_SCALAR_TABLE_FUNCTION_NAMES = frozenset({"format"})

_TABLE_ENGINES = frozenset({
    "MergeTree", "ReplacingMergeTree", "SummingMergeTree", "AggregatingMergeTree", "CollapsingMergeTree",
    "VersionedCollapsingMergeTree", "CoalescingMergeTree", "Memory", "Null", "Log", "TinyLog", "StripeLog", "Set",
    "Join", "Merge",
})
_DATABASE_ENGINES = frozenset({"Atomic", "Memory"})

#: MergeTree settings a table may set (CREATE ... SETTINGS, ALTER ... MODIFY SETTING, column SETTINGS).
_TABLE_SETTINGS = frozenset({
    "index_granularity", "index_granularity_bytes", "enable_mixed_granularity_parts", "ttl_only_drop_parts",
    "merge_with_ttl_timeout", "merge_with_recompression_ttl_timeout", "min_bytes_for_wide_part",
    "min_rows_for_wide_part", "allow_nullable_key", "min_age_to_force_merge_seconds",
    "min_age_to_force_merge_on_partition_only", "deduplicate_merge_projection_mode",
    "lightweight_mutation_projection_mode", "non_replicated_deduplication_window", "parts_to_delay_insert",
    "parts_to_throw_insert", "max_parts_in_total", "old_parts_lifetime", "cleanup_delay_period",
    "enable_block_number_column", "enable_block_offset_column", "add_minmax_index_for_numeric_columns",
    "add_minmax_index_for_string_columns", "max_compress_block_size", "min_compress_block_size", "compress_marks",
    "compress_primary_key", "primary_key_compress_block_size", "marks_compress_block_size",
    "allow_experimental_replacing_merge_with_cleanup", "max_suspicious_broken_parts",
})

#: Output and input formats (lower case). Left out: Protobuf* and CapnProto read a schema file, AvroConfluent
#: fetches its schema from a URL, the wire formats (MySQLWire, PostgreSQLWire, ODBCDriver2) are not HTTP answers.
_FORMATS = _words(
    "Arrow ArrowStream Avro BSONEachRow Buffers CSV CSVWithNames CSVWithNamesAndTypes CustomSeparated "
    "CustomSeparatedIgnoreSpaces CustomSeparatedIgnoreSpacesWithNames CustomSeparatedIgnoreSpacesWithNamesAndTypes "
    "CustomSeparatedWithNames CustomSeparatedWithNamesAndTypes DWARF Form GeoJSON Hash HiveText JSON JSONAsObject "
    "JSONAsString JSONColumns JSONColumnsWithMetadata JSONCompact JSONCompactColumns JSONCompactEachRow "
    "JSONCompactEachRowWithNames JSONCompactEachRowWithNamesAndTypes JSONCompactEachRowWithProgress "
    "JSONCompactStrings JSONCompactStringsEachRow JSONCompactStringsEachRowWithNames "
    "JSONCompactStringsEachRowWithNamesAndTypes JSONCompactStringsEachRowWithProgress JSONEachRow "
    "JSONEachRowWithProgress JSONL JSONLines JSONObjectEachRow JSONStrings JSONStringsEachRow "
    "JSONStringsEachRowWithProgress LineAsString LineAsStringWithNames LineAsStringWithNamesAndTypes MD Markdown "
    "MsgPack MySQLDump NDJSON Native Npy Null ORC One PNG Parquet ParquetMetadata Pretty PrettyCompact "
    "PrettyCompactMonoBlock PrettyCompactNoEscapes PrettyCompactNoEscapesMonoBlock PrettyJSONEachRow "
    "PrettyJSONLines PrettyMonoBlock PrettyNDJSON PrettyNoEscapes PrettyNoEscapesMonoBlock PrettySpace "
    "PrettySpaceMonoBlock PrettySpaceNoEscapes PrettySpaceNoEscapesMonoBlock Prometheus Raw RawBLOB RawWithNames "
    "RawWithNamesAndTypes Regexp RowBinary RowBinaryWithDefaults RowBinaryWithNames RowBinaryWithNamesAndTypes "
    "RowBinaryWithNamesAndTypesAndDefaults SQLInsert TSKV TSV TSVRaw TSVRawWithNames TSVRawWithNamesAndTypes "
    "TSVWithNames TSVWithNamesAndTypes TabSeparated TabSeparatedRaw TabSeparatedRawWithNames "
    "TabSeparatedRawWithNamesAndTypes TabSeparatedWithNames TabSeparatedWithNamesAndTypes Template "
    "TemplateIgnoreSpaces Values Vertical XML")

_DENIED_FORMATS: Mapping[str, str] = {
    "protobuf": "it reads a schema file", "protobuflist": "it reads a schema file",
    "protobufsingle": "it reads a schema file", "capnproto": "it reads a schema file",
    "avroconfluent": "it fetches its schema from a URL", "mysqlwire": "it is not an HTTP answer",
    "postgresqlwire": "it is not an HTTP answer", "odbcdriver2": "it is not an HTTP answer",
}

#: ALTER TABLE commands the writer may run: what the migrations do (ADD COLUMN, MODIFY ORDER BY, ADD/MATERIALIZE
#: INDEX, MODIFY TTL for retention) and their additive kin; DELETE (a mutation) clears rows. Nothing that drops
#: columns, partitions, indexes or projections, replaces partitions or rewrites rows (UPDATE).
_ALTER_COMMANDS = frozenset({
    "ADD_COLUMN", "MODIFY_COLUMN", "COMMENT_COLUMN", "MATERIALIZE_COLUMN", "MODIFY_ORDER_BY", "ADD_INDEX",
    "MATERIALIZE_INDEX",
    "ADD_STATISTICS", "MATERIALIZE_STATISTICS", "ADD_CONSTRAINT", "ADD_PROJECTION", "MATERIALIZE_PROJECTION",
    "MODIFY_TTL", "MATERIALIZE_TTL", "MODIFY_SETTING", "MODIFY_COMMENT", "DELETE",
})

#: Boolean members of a CreateQuery that may be true. ``replace_view``: CREATE OR REPLACE VIEW (a migration
#: redefines a view, which holds no data); a table is never replaced (it drops the one it replaces).
_CREATE_FLAGS = frozenset({
    "if_not_exists", "is_ordinary_view", "is_materialized_view", "is_populate", "is_create_empty", "is_clone_as",
    "replace_view",
})

#: The statements the writer may run: what the product sends (store/migrations.py and sql/, the job's and the
#: evaluator's inserts, the benches' and tests' OPTIMIZE). DROP, TRUNCATE, RENAME/EXCHANGE, DELETE, UPDATE and
#: CREATE/DROP INDEX are refused: nothing in the product runs them, and they are how a writer credential would
#: destroy what it did not write.
_WRITER_STATEMENTS = frozenset({"InsertQuery", "CreateQuery", "AlterQuery", "OptimizeQuery"})

#: Databases no statement may write to, create, alter or drop (compared in lower case): the engine's own, which
#: every later request (the guard's own parse included) relies on.
PROTECTED_DATABASES = frozenset({"system", "information_schema"})

#: Longest database name :func:`is_database_name` accepts.
DATABASE_NAME_MAX = 128


def is_database_name(name: str) -> bool:
    """Whether ``name`` is a plain identifier (ASCII letters, digits, ``_``; not starting with a digit): the only
    names the writer may give a database and a request may name as its ``database``, so that no name can carry a
    quote, an escape or a second statement wherever it is used."""
    return (0 < len(name) <= DATABASE_NAME_MAX and name.isascii() and not name[0].isdigit()
            and name.replace("_", "a").isalnum())

#: Nodes whose expressions a table keeps and evaluates later, in chDB's background (merges, TTL, mutations), where
#: the request's settings and limits do not apply: no subquery and no table function may appear under them.
_BACKGROUND_NODES = frozenset({
    "ColumnDeclaration", "Storage", "TTLElement", "IndexDeclaration", "ProjectionDeclaration",
    "ConstraintDeclaration", "StatisticsDeclaration", "AlterCommand",
})

#: Statement roots: node type → (kind, read only).
_STATEMENTS: Mapping[str, tuple[Kind, bool]] = {
    "SelectWithUnionQuery": ("select", True),
    "ShowTablesQuery": ("select", True),
    "ShowColumnsQuery": ("select", True),
    "ShowIndexesQuery": ("select", True),
    "CheckTableQuery": ("select", True),
    "ExplainQuery": ("select", True),
    "InsertQuery": ("insert", False),
    "CreateQuery": ("ddl", False),
    "AlterQuery": ("ddl", False),
    "DropQuery": ("ddl", False),
    "RenameQuery": ("ddl", False),
    "OptimizeQuery": ("ddl", False),
    "DeleteQuery": ("ddl", False),
    "UpdateQuery": ("ddl", False),
    "CreateIndexQuery": ("ddl", False),
    "DropIndexQuery": ("ddl", False),
}

#: Every other node type the guard lets appear inside an allowed statement.
_NODE_TYPES = frozenset({
    "ExpressionList", "SelectQuery", "Literal", "Identifier", "TableIdentifier", "Function", "Asterisk",
    "QualifiedAsterisk", "ColumnsRegexpMatcher", "ColumnsListMatcher", "QualifiedColumnsRegexpMatcher",
    "QualifiedColumnsListMatcher", "ColumnsTransformerList", "ColumnsApplyTransformer", "ColumnsExceptTransformer",
    "ColumnsReplaceTransformer", "ColumnsReplaceTransformerReplacement", "TablesInSelectQuery",
    "TablesInSelectQueryElement", "TableExpression", "TableJoin", "ArrayJoin", "Subquery", "WithElement",
    "OrderByElement", "InterpolateElement", "WindowDefinition", "WindowListElement", "SampleRatio", "SetQuery",
    "QueryParameter", "DataType", "Columns definition", "ColumnDeclaration", "Storage", "TTLElement",
    "IndexDeclaration", "ConstraintDeclaration", "ProjectionDeclaration", "ProjectionSelectQuery",
    "StatisticsDeclaration", "ViewTargets", "AlterCommand", "Partition", "Assignment", "NameTypePair",
    "ObjectTypeArgument", "TimeInterval", "EnumDataType", "TupleDataType",
})

#: Scalar functions that reach the host, the network or the process (lower case; aliases resolve to these or are
#: listed): from ``system.functions``' descriptions and categories (AI, Introspection).
_HOST_FUNCTIONS: Mapping[str, str] = {
    "file": "reads a host file",
    "catboostevaluate": "loads a library and a model from host paths",
    "naivebayesclassifier": "reads a model from a host path",
    "aiclassify": "calls a network service", "aiembed": "calls a network service",
    "aiextract": "calls a network service", "aifilter": "calls a network service",
    "aigenerate": "calls a network service", "airedact": "calls a network service",
    "aisimilarity": "calls a network service", "aitranslate": "calls a network service",
    "addresstoline": "reads the server binary", "addresstolinewithinlines": "reads the server binary",
    "addresstosymbol": "reads the server binary", "demangle": "introspects the server binary",
    "logtrace": "writes to the server log", "generateserialid": "writes to ZooKeeper/Keeper",
    "filesystemavailable": "reads host disk details", "filesystemcapacity": "reads host disk details",
    "filesystemunreserved": "reads host disk details", "getserversetting": "reads server configuration",
    "getmacro": "reads server configuration",
}

#: Query settings no statement may change (also checked by :func:`check_settings` for URL parameters).
_DENIED_SETTINGS = frozenset({
    *ENFORCED_SETTINGS,
    "dialect", "enable_json_ast_dialect", "allow_experimental_kusto_dialect", "allow_experimental_prql_dialect",
    "allow_experimental_polyglot_dialect", "polyglot_dialect", "enable_trino_dialect",
    "format_schema", "format_schema_source", "format_schema_message_name", "output_format_schema",
    "format_template_resultset", "format_template_row", "input_format_record_errors_file_path",
    "format_avro_schema_registry_url", "additional_table_filters", "additional_result_filter",
    "parallel_replicas_custom_key", "format_display_secrets_in_show_and_select",
    "into_outfile_create_parent_directories",
    "max_query_size", "max_parser_depth", "max_parser_backtracks", "allow_introspection_functions",
    "dynamic_disk_allow_from_env", "dynamic_disk_allow_include", "dynamic_disk_allow_from_zk",
    "allow_archive_path_syntax", "s3queue_default_zookeeper_path", "filesystem_cache_name",
    "allow_ddl", "allow_settings_after_format_in_insert",
})


# --- the check --------------------------------------------------------------------------------------------------

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
            return _check_explained(_call(parse, f"EXPLAIN AST {statement}"), error.message)
        else:
            raise
    verdict = _Walk(role, caps or {}).statement(tree)
    if inline:
        # chDB runs the text as a script: the Values format's data ends at a `;`, and whatever follows runs as
        # the next statement (`VALUES (1); DROP TABLE t`), which no parse of the statement sees.
        raise Refused(*BAD_ARGUMENTS, "INSERT with its data inside the statement is not allowed: send "
                                      "`INSERT INTO t FORMAT Values` (or another format) and the rows after it, "
                                      "as the request body")
    return verdict


def check_settings(settings: Mapping[str, Any], caps: Mapping[str, float] | None = None) -> None:
    """Refuse settings a client may not change (URL parameters, for instance): ``readonly``, those that name
    files, URLs or dialects or undo :data:`ENFORCED_SETTINGS`, and values above ``caps``."""
    for name, value in settings.items():
        _check_setting(name, value, caps or {})


def check_format(name: str) -> str:
    """Refuse a format outside the allow-list (``default_format`` URL parameter, for instance); return it."""
    lower = name.lower()
    if lower in _DENIED_FORMATS:
        raise _refuse(f"format {name} is not allowed: {_DENIED_FORMATS[lower]}")
    if lower not in _FORMATS:
        raise Refused(*UNKNOWN_FORMAT, f"Unknown format {name}")
    return name


# --- parsing ----------------------------------------------------------------------------------------------------

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
        refused = _clickhouse_error(str(error))
        if refused is None:
            raise
        raise refused from None


def _clickhouse_error(text: str) -> Refused | None:
    """A ClickHouse error's code, name and message, from its text ``Code: N. DB::Exception: msg. (NAME)``."""
    start = text.find("Code: ")
    if start < 0:
        return None
    end = start + 6
    while end < len(text) and text[end].isdigit():
        end += 1
    if end == start + 6:
        return None
    code = int(text[start + 6:end])
    message = text[end:].lstrip(". ").removeprefix("DB::Exception: ")
    name = "UNKNOWN_EXCEPTION"
    close = message.rfind(")")
    open_ = message.rfind("(", 0, close) if close >= 0 else -1
    if open_ >= 0 and message[open_ + 1:close].replace("_", "").isalnum() and message[open_ + 1:close].isupper():
        name = message[open_ + 1:close]
        message = message[:open_].rstrip(" .")
    # The statement was wrapped in toValidUTF8(parseQueryToJSON(...)): that scope is the guard's, not the client's.
    cut = message.find("In scope SELECT toValidUTF8(parseQueryToJSON(")
    if cut >= 0:
        message = message[:cut].rstrip(" :.")
    return Refused(code, name, message[:_MESSAGE_LIMIT])


# --- the JSON walk ----------------------------------------------------------------------------------------------

def _refuse(message: str) -> Refused:
    return Refused(*ACCESS_DENIED, message)


def _children(node: Any) -> Iterator[tuple[str, Any]]:
    if isinstance(node, dict):
        yield from node.items()
    elif isinstance(node, list):
        for item in node:
            yield "", item


class _Walk:
    """One pass over a statement's JSON AST, refusing as it goes and collecting what the Verdict needs."""

    def __init__(self, role: Role, caps: Mapping[str, float]) -> None:
        self.role = role
        self.caps = caps
        self.settings: dict[str, Any] = {}
        self.stored = False    # a CREATE or ALTER: what it holds is kept and may run later, in the background

    def statement(self, root: dict[str, Any]) -> Verdict:
        kind, read_only, name = self._root(root)
        inner = root["query"] if name == "ExplainQuery" else root
        self.stored = inner.get("type") in ("CreateQuery", "AlterQuery")
        uses_input = self._walk(root)
        # After the walk, so that a statement refused for everyone says why, whichever the role.
        self._role(root)
        if not _STATEMENTS[str(inner.get("type"))][1]:
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
                raise _refuse("EXPLAIN without a statement is not allowed")
            self._root(inner)
            return "select", True, name
        if name not in _STATEMENTS:
            raise _refuse(_statement_refusal(root))
        kind, read_only = _STATEMENTS[name]
        return kind, read_only, name

    def _role(self, root: dict[str, Any]) -> None:
        name = str(root.get("type"))
        if name == "ExplainQuery" and isinstance(root.get("query"), dict):
            self._role(root["query"])
        elif not _STATEMENTS[name][1] and self.role != "writer":
            raise Refused(*READONLY, f"Cannot execute {_label(name)} in readonly mode: the reader credential "
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
                        raise _refuse("table function input is only allowed in INSERT ... SELECT")
                    uses_input = True
                below = background or node_type in _BACKGROUND_NODES
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
        if node_type in _STATEMENTS and node_type != "SelectWithUnionQuery" and not is_root:
            raise _refuse(f"{_label(node_type)} inside another statement is not allowed")
        if node_type not in _STATEMENTS and node_type not in _NODE_TYPES:
            raise _refuse(f"{_label(node_type)} is not allowed")
        if node.get("out_file") is not None:
            raise _refuse("INTO OUTFILE is not allowed: it writes a host file")
        if node.get("infile") is not None:
            raise _refuse("FROM INFILE is not allowed: it reads a host file")
        if node.get("is_into_outfile_with_stdout"):
            raise _refuse("INTO OUTFILE is not allowed: it writes a host file")
        if node_type == "Function":
            self._function(node, key, parent)
        elif node_type == "SetQuery":
            self._set(node, key, parent)
        elif node_type == "InsertQuery" and node.get("table_function") is not None:
            raise _refuse("INSERT INTO FUNCTION is not allowed: insert into a table")
        elif node_type == "CreateQuery":
            self._create(node)
        elif node_type == "AlterQuery":
            if node.get("alter_object") != "TABLE":
                raise _refuse(f"ALTER {node.get('alter_object')} is not allowed")
        elif node_type == "AlterCommand":
            command = node.get("command_type")
            if command not in _ALTER_COMMANDS:
                raise _refuse(f"ALTER TABLE {str(command).replace('_', ' ')} is not allowed")
        elif node_type == "DropQuery":
            drop_kind = node.get("kind")
            if drop_kind not in ("Drop", "Truncate"):
                raise _refuse(f"{str(drop_kind).upper()} is not allowed")
            if node.get("is_dictionary") or node.get("temporary") or node.get("is_temporary"):
                raise _refuse("dictionaries and temporary tables are not allowed")
        elif node_type == "RenameQuery" and node.get("dictionary"):
            raise _refuse("dictionaries are not allowed")

    def _function(self, node: dict[str, Any], key: str, parent: str | None) -> None:
        name = str(node.get("name", ""))
        kind = node.get("kind")
        if kind == "TABLE_ENGINE" or (parent == "Storage" and key == "engine" and kind != "DATABASE_ENGINE"):
            if name not in _TABLE_ENGINES:
                raise _refuse(f"table engine {name} is not allowed: it reaches the host or other servers "
                              f"(allowed: {', '.join(sorted(_TABLE_ENGINES))})")
            return
        if kind == "DATABASE_ENGINE":
            if name not in _DATABASE_ENGINES:
                raise _refuse(f"database engine {name} is not allowed: it reaches the host or other servers "
                              f"(allowed: {', '.join(sorted(_DATABASE_ENGINES))})")
            return
        if kind not in (None, "ORDINARY_FUNCTION", "WINDOW_FUNCTION", "LAMBDA_FUNCTION", "CODEC", "STATISTICS"):
            raise _refuse(f"function {name} ({kind}) is not allowed")
        lower = name.lower()
        table_position = key in ("table_function", "as_table_function")
        if not table_position and lower in _HOST_FUNCTIONS:
            raise _refuse(f"function {name} is not allowed: it {_HOST_FUNCTIONS[lower]}")
        if table_position or (lower in _KNOWN_TABLE_FUNCTIONS and lower not in _SCALAR_TABLE_FUNCTION_NAMES):
            if lower not in _TABLE_FUNCTIONS and lower not in _INSERT_TABLE_FUNCTIONS:
                why = "it reaches the host" if lower.startswith(_HOST_TABLE_FUNCTIONS) else "not on the allow-list"
                raise _refuse(f"table function {name} is not allowed: {why} "
                              f"(allowed: {', '.join(sorted(_TABLE_FUNCTIONS))})")
            if lower == "format":
                if self.stored:
                    raise _refuse("table function format is not allowed in CREATE or ALTER: what a table or view "
                                  "keeps may run later, where the request's settings do not apply")
                _check_format_argument(node)
            return
        if lower.startswith("__"):
            raise _refuse(f"function {name} is not allowed: it is internal")

    def _set(self, node: dict[str, Any], key: str, parent: str | None) -> None:
        changes = node.get("changes") or []
        if node.get("is_standalone"):
            raise _refuse("SET is not allowed: settings come from URL parameters, per request")
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
                if name not in _TABLE_SETTINGS:
                    raise _refuse(f"table setting {name} is not allowed")
                if isinstance(value, _Custom):
                    raise _refuse(f"table setting {name}: only a literal value is allowed")
            else:
                _check_setting(name, value, self.caps)
                self.settings[name] = value

    def _create(self, node: dict[str, Any]) -> None:
        if node.get("refresh_strategy") is not None:
            raise _refuse("a refreshable materialized view (REFRESH EVERY/AFTER) is not allowed: its refreshes run "
                          "in the background, outside every setting and limit of the request")
        if node.get("replace_table") or node.get("create_or_replace") or (
                node.get("replace_view") and not node.get("is_ordinary_view")):
            raise _refuse("CREATE OR REPLACE / REPLACE is not allowed but for a plain VIEW: it drops what it replaces")
        if node.get("is_temporary") or node.get("temporary"):
            raise _refuse("temporary tables are not allowed: they would outlive the request on a pooled connection")
        if node.get("attach"):
            raise _refuse("ATTACH is not allowed")
        if node.get("has_attach_from_path") or node.get("attach_from_path"):
            raise _refuse("ATTACH ... FROM path is not allowed: it reads host files")
        if node.get("is_dictionary"):
            raise _refuse("CREATE DICTIONARY is not allowed: dictionary sources reach the host")
        for flag, value in node.items():
            if value is True and flag not in _CREATE_FLAGS and not flag.startswith("is_outfile"):
                if flag in ("has_uuid", "has_uuid_clause", "has_inner_uuid_clause"):
                    continue
                raise _refuse(f"CREATE with {flag} is not allowed")


def _check_format_argument(node: dict[str, Any]) -> None:
    """``format(<format>, [<structure>,] <data>)``: the format is a name or a string the guard reads, and is
    allow-listed (``format(Protobuf, ...)``); the structure and the data are string literals. A query parameter,
    an expression or a subquery in their place would be read by chDB only, after the guard."""
    arguments = node.get("arguments")
    children = arguments.get("children") if isinstance(arguments, dict) else None
    if not isinstance(children, list) or len(children) < 2 or not all(isinstance(c, dict) for c in children):
        raise _refuse("table function format needs its format and its data as literals")
    first = children[0]
    if first.get("type") == "Identifier" and isinstance(first.get("name"), str) and first["name"] \
            and not first.get("children"):
        check_format(first["name"])
    elif first.get("type") == "Literal" and isinstance(_field(first.get("value")), str):
        check_format(_field(first.get("value")))
    else:
        raise _refuse("table function format: its format must be a name written in the statement (not a query "
                      "parameter or an expression)")
    for argument in children[1:]:
        if argument.get("type") != "Literal" or not isinstance(_field(argument.get("value")), str):
            raise _refuse("table function format: its structure and data must be string literals written in the "
                          "statement (not a query parameter, an expression or a subquery)")


def _check_background(node: dict[str, Any]) -> None:
    """A node of a table's definition or of an ALTER command: chDB evaluates these later (merges, TTL, mutations)
    in its background context, where the request's settings and limits do not apply."""
    node_type = node["type"]
    if node_type in ("Subquery", "SelectWithUnionQuery", "SelectQuery"):
        raise _refuse("a subquery is not allowed in a table's definition or an ALTER command: it would run in the "
                      "background, outside the request's limits")
    if node_type == "QueryParameter":
        raise _refuse("a query parameter is not allowed in a table's definition or an ALTER command: what is kept "
                      "must be written in the statement")
    if node_type == "Function":
        lower = str(node.get("name", "")).lower()
        if lower in _KNOWN_TABLE_FUNCTIONS and lower not in _SCALAR_TABLE_FUNCTION_NAMES:
            raise _refuse(f"table function {node.get('name')} is not allowed in a table's definition or an ALTER "
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
    if name not in _WRITER_STATEMENTS:
        raise _refuse(f"{_label(name)} is not allowed: the writer runs the statements the product sends (INSERT, "
                      "CREATE DATABASE/TABLE/VIEW/MATERIALIZED VIEW, ALTER TABLE, OPTIMIZE)")
    for database in _written_databases(root):
        if database.lower() in PROTECTED_DATABASES:
            raise _refuse(f"{_label(name)} in database {database} is not allowed: it is the engine's own")
    if name == "CreateQuery" and not root.get("table") and isinstance(root.get("database"), str) \
            and not is_database_name(root["database"]):
        raise _refuse(f"database name {root['database'][:100]!r} is not allowed: a database's name is a plain "
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
    if lower in _DENIED_SETTINGS or "dialect" in lower or lower.endswith("_path") or lower.endswith("_url"):
        raise _refuse(f"setting {name} may not be changed")
    if isinstance(value, _Custom):
        raise _refuse(f"setting {name}: only a literal value is allowed")
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


def _label(node_type: str) -> str:
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
    return f"{_label(name)} is not allowed"


# --- DESCRIBE, EXISTS, SHOW CREATE (no JSON form): EXPLAIN AST, line by line -------------------------------------

_EXPLAINED_ROOTS = {
    "DescribeQuery": "DESCRIBE", "ExistsTableQuery": "EXISTS", "ExistsDatabaseQuery": "EXISTS",
    "ExistsViewQuery": "EXISTS", "ExistsDictionaryQuery": "EXISTS", "ShowCreateTableQuery": "SHOW CREATE",
    "ShowCreateViewQuery": "SHOW CREATE", "ShowCreateDatabaseQuery": "SHOW CREATE",
}


def _check_explained(text: str, unsupported: str) -> Verdict:
    """Allow DESCRIBE/EXISTS/SHOW CREATE of a table (name only) from their ``EXPLAIN AST`` lines.

    Each AST node is one line, its type first; a name holding a line break can only add lines, and every line
    must be of an allowed type, so such a name makes the statement refused, never allowed.
    """
    lines = [line for line in text.split("\n") if line.strip()]
    if not lines:
        raise _refuse("the statement could not be checked")
    root = lines[0].split(" ", 1)[0]
    if root not in _EXPLAINED_ROOTS:
        if root in _STATEMENTS:
            # An allowed kind of statement holding a part the parser cannot give as JSON (``unsupported`` names it):
            # what the guard cannot see, it does not let through.
            start = unsupported.find("AST node of type '")
            end = unsupported.find("'", start + 18) if start >= 0 else -1
            part = unsupported[start + 18:end] if end > start >= 0 else "a part"
            raise _refuse(f"{_label(root)} with {part} is not allowed: the guard cannot inspect it")
        raise _refuse(f"{_label(root)} is not allowed")
    allowed = {"Identifier", "TableIdentifier"} | ({"TableExpression"} if root == "DescribeQuery" else set())
    fmt: str | None = None
    names: list[str] = []      # the root's Identifier children: the names, then the FORMAT clause's, if any
    for line in lines[1:]:
        stripped = line.lstrip(" ")
        depth = len(line) - len(stripped)
        node_type, _, rest = stripped.partition(" ")
        if node_type not in allowed:
            what = {"Literal": "INTO OUTFILE", "Set": "SETTINGS", "Function": "a function"}.get(node_type, node_type)
            raise _refuse(f"{_EXPLAINED_ROOTS[root]} accepts a table name only ({what} is not allowed here)")
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
        raise _refuse(f"{_EXPLAINED_ROOTS[root]}: the statement could not be checked")
    return check_format(names[-1].strip()) if readings[0] else None
