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
  and EXPLAIN of those; a ``writer`` also what the product sends (``WRITER_STATEMENTS``: the job's and the
  evaluator's inserts, the migrations' CREATE DATABASE/TABLE/VIEW/MATERIALIZED VIEW and ALTER TABLE, OPTIMIZE),
  with ALTER TABLE limited to the commands in ``ALTER_COMMANDS``. DROP, TRUNCATE, RENAME/EXCHANGE, DELETE,
  UPDATE, CREATE/DROP INDEX, CREATE OR REPLACE and everything else (SET, USE, SYSTEM, KILL, BACKUP/RESTORE,
  ATTACH/DETACH, GRANT, CREATE USER/ROLE/FUNCTION/DICTIONARY, transactions, temporary tables, ...) are refused
  for everyone; no statement writes into ``system`` or ``information_schema`` (``PROTECTED_DATABASES``), and a
  database the writer creates has a plain identifier for a name (:func:`is_database_name`);
- nothing that runs later in chDB's background, where the request's settings and limits do not apply: no
  refreshable materialized view (``REFRESH EVERY/AFTER``), no subquery or table function in a table's
  definition (columns, TTL, keys) or in an ALTER (mutations run in the background), no ``format()`` table
  function in a CREATE or ALTER; elsewhere ``format()`` must name its format and give its data as string
  literals the guard reads (not a query parameter, an expression or a subquery);
- the AST node types (``NODE_TYPES``): a construct the guard has not been taught is refused, not passed;
- table functions (``TABLE_FUNCTIONS``), wherever a function of that name appears; ``input`` only inside an
  INSERT; table engines (``TABLE_ENGINES``: MergeTree family, Memory, Null, Log family, Set, Join, Merge — not
  Distributed/Buffer/Replicated*, which reach other hosts or ZooKeeper) and database engines (Atomic, Memory);
- table-level engine settings (``TABLE_SETTINGS``: ``disk``/``storage_policy`` would put parts anywhere);
- formats (``FORMATS``: no Protobuf/CapnProto, which read a schema file, no AvroConfluent, which fetches one).

Deny-lists remain where an allow-list is impractical: scalar functions (about 1,700 of them) refuse those that
reach the host or the network (``HOST_FUNCTIONS``, from ``system.functions``: ``file``, ``catboostEvaluate``,
the ``ai*`` functions, introspection, ...), and query settings refuse those that name files, URLs or parsing
dialects, that carry SQL evaluated later (``additional_table_filters``) or that would undo
:data:`ENFORCED_SETTINGS` (``DENIED_SETTINGS``). ``readonly`` can never be changed (READONLY), and the settings
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
empty. The writer reads every ``system`` table; the reader (the credential a Grafana instance or the dashboard holds)
only those that describe the data (``READER_SYSTEM_TABLES``: databases, tables, columns, functions, settings, ...),
never a column naming a host path (``SYSTEM_PATH_COLUMNS``) in a statement that reads a system table, nor all columns
(``*``, ``COLUMNS(...)``) in one that reads a table that has such columns, and no ``merge()``, which reads tables by
pattern.

Cost: one chDB call per statement (two for DESCRIBE/EXISTS/SHOW CREATE and inline-data inserts, or a refusal
that names its node); no regular expression reads the user's text; the walk is linear in the AST.

Its parts: ``policy`` (what is allowed: data only), ``refusal`` (ClickHouse's error answers), ``walk`` (the JSON
walk, and the setting and format checks), ``explained`` (DESCRIBE, EXISTS, SHOW CREATE), ``statement``
(:func:`check`: the parse, then the walk). Each imports only those listed before it.
"""

from store.server.guard.policy import ENFORCED_SETTINGS, PROTECTED_DATABASES, Kind, Role, is_database_name
from store.server.guard.refusal import Refused
from store.server.guard.statement import DEFAULT_MAX_QUERY_SIZE, check
from store.server.guard.walk import Verdict, check_format, check_settings

__all__ = ["DEFAULT_MAX_QUERY_SIZE", "ENFORCED_SETTINGS", "PROTECTED_DATABASES", "Kind", "Refused", "Role", "Verdict",
           "check", "check_format", "check_settings", "is_database_name"]
