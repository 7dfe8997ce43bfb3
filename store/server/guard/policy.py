"""What the guard allows: the allow-lists of statements, table functions, engines, formats, table settings and AST
node types, and the deny-lists where an allow-list is impractical (scalar functions, query settings). Data only:
:mod:`store.server.guard.walk` applies it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

Role = Literal["reader", "writer"]
Kind = Literal["select", "insert", "ddl"]

#: Settings the server applies to every query it runs, after the client's own, and which no statement may change
#: (they are in ``DENIED_SETTINGS``): the ``Values`` input format evaluates SQL expressions found in the *data*
#: (``INSERT ... VALUES (file('/etc/passwd'))``, ``format(Values, ...)``), which no parse of the statement sees;
#: chDB's ``Python()`` table function reads the server process's Python objects.
ENFORCED_SETTINGS: Mapping[str, str] = {
    "input_format_values_interpret_expressions": "0",
    "input_format_values_deduce_templates_of_expressions": "0",
    "allow_python_table_function": "0",
}


def _words(text: str) -> frozenset[str]:
    return frozenset(word.lower() for word in text.split())


#: Table functions that reach nothing outside the store (compared in lower case).
TABLE_FUNCTIONS = frozenset({
    "numbers", "numbers_mt", "zeros", "zeros_mt", "values", "generaterandom", "null", "view", "merge", "format",
    "generate_series", "generateseries", "primes",
})
#: Allowed only inside an INSERT (it reads the request body).
INSERT_TABLE_FUNCTIONS = frozenset({"input"})

#: Every table function chDB 4.4 knows (system.table_functions, lower case): a function of one of these names is
#: judged as a table function wherever it appears. ``format`` and ``file`` are scalar functions too.
KNOWN_TABLE_FUNCTIONS = _words(
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
HOST_TABLE_FUNCTIONS = (
    "file", "url", "s3", "hdfs", "azure", "gcs", "cosn", "oss", "iceberg", "deltalake", "hudi", "paimon", "remote",
    "cluster", "mysql", "postgresql", "mongodb", "redis", "sqlite", "jdbc", "odbc", "executable", "python",
    "filesystem", "ytsaurus", "bigquery", "prometheus", "arrow", "eval", "dictionary",
)

#: Scalar functions that are also table-function names and harmless as scalars.
SCALAR_TABLE_FUNCTION_NAMES = frozenset({"format"})

TABLE_ENGINES = frozenset({
    "MergeTree", "ReplacingMergeTree", "SummingMergeTree", "AggregatingMergeTree", "CollapsingMergeTree",
    "VersionedCollapsingMergeTree", "CoalescingMergeTree", "Memory", "Null", "Log", "TinyLog", "StripeLog", "Set",
    "Join", "Merge",
})
DATABASE_ENGINES = frozenset({"Atomic", "Memory"})

#: MergeTree settings a table may set (CREATE ... SETTINGS, ALTER ... MODIFY SETTING, column SETTINGS).
TABLE_SETTINGS = frozenset({
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
FORMATS = _words(
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

DENIED_FORMATS: Mapping[str, str] = {
    "protobuf": "it reads a schema file", "protobuflist": "it reads a schema file",
    "protobufsingle": "it reads a schema file", "capnproto": "it reads a schema file",
    "avroconfluent": "it fetches its schema from a URL", "mysqlwire": "it is not an HTTP answer",
    "postgresqlwire": "it is not an HTTP answer", "odbcdriver2": "it is not an HTTP answer",
}

#: ALTER TABLE commands the writer may run: what the migrations do (ADD COLUMN, MODIFY ORDER BY, ADD/MATERIALIZE
#: INDEX, MODIFY TTL for retention) and their additive kin; DELETE (a mutation) clears rows. Nothing that drops
#: columns, partitions, indexes or projections, replaces partitions or rewrites rows (UPDATE).
ALTER_COMMANDS = frozenset({
    "ADD_COLUMN", "MODIFY_COLUMN", "COMMENT_COLUMN", "MATERIALIZE_COLUMN", "MODIFY_ORDER_BY", "ADD_INDEX",
    "MATERIALIZE_INDEX",
    "ADD_STATISTICS", "MATERIALIZE_STATISTICS", "ADD_CONSTRAINT", "ADD_PROJECTION", "MATERIALIZE_PROJECTION",
    "MODIFY_TTL", "MATERIALIZE_TTL", "MODIFY_SETTING", "MODIFY_COMMENT", "DELETE",
})

#: Boolean members of a CreateQuery that may be true. ``replace_view``: CREATE OR REPLACE VIEW (a migration
#: redefines a view, which holds no data); a table is never replaced (it drops the one it replaces).
CREATE_FLAGS = frozenset({
    "if_not_exists", "is_ordinary_view", "is_materialized_view", "is_populate", "is_create_empty", "is_clone_as",
    "replace_view",
})

#: The statements the writer may run: what the product sends (store/migrations.py and sql/, the job's and the
#: evaluator's inserts, the benches' and tests' OPTIMIZE). DROP, TRUNCATE, RENAME/EXCHANGE, DELETE, UPDATE and
#: CREATE/DROP INDEX are refused: nothing in the product runs them, and they are how a writer credential would
#: destroy what it did not write.
WRITER_STATEMENTS = frozenset({"InsertQuery", "CreateQuery", "AlterQuery", "OptimizeQuery"})

#: Databases no statement may write to, create, alter or drop (compared in lower case): the engine's own, which
#: every later request (the guard's own parse included) relies on.
PROTECTED_DATABASES = frozenset({"system", "information_schema"})

#: The ``system`` tables the reader may read (lower case): what describes the databases, their tables and columns,
#: and the engine's vocabulary (what clients such as Grafana's ClickHouse data source and clickhouse-connect ask);
#: never what shows the host or other users' work (``processes``, ``query_log``, ``stack_trace``, ``symbols``,
#: ``disks``, ``parts``, ``errors``, ``server_settings``, ...).
READER_SYSTEM_TABLES = frozenset({
    "one", "numbers", "numbers_mt", "zeros", "zeros_mt", "databases", "tables", "columns", "functions",
    "table_functions", "data_type_families", "formats", "settings", "time_zones", "collations", "table_engines",
    "database_engines", "aggregate_function_combinators", "keywords", "merge_tree_settings",
})
#: Columns of those tables that name host paths: a reader's statement that reads a system table may not name them,
#: nor ask for all columns (``*``, ``COLUMNS(...)``) when it reads one of :data:`SYSTEM_TABLES_WITH_PATHS`.
SYSTEM_PATH_COLUMNS = frozenset({"data_path", "data_paths", "metadata_path", "path"})
SYSTEM_TABLES_WITH_PATHS = frozenset({"databases", "tables"})

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
BACKGROUND_NODES = frozenset({
    "ColumnDeclaration", "Storage", "TTLElement", "IndexDeclaration", "ProjectionDeclaration",
    "ConstraintDeclaration", "StatisticsDeclaration", "AlterCommand",
})

#: Statement roots: node type → (kind, read only).
STATEMENTS: Mapping[str, tuple[Kind, bool]] = {
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
NODE_TYPES = frozenset({
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
HOST_FUNCTIONS: Mapping[str, str] = {
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
DENIED_SETTINGS = frozenset({
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
