"""The embedded store's server: one process that owns the chDB directory and answers ClickHouse's HTTP interface,
with the access control a ClickHouse server would apply (``python -m store.server``, ``eventide store serve``).
Only the launcher (``stack/``), the tests and the benches start it; the store's clients (``store/client.py`` and
what uses it) reach it over HTTP and import nothing from here.

Each part imports only those listed before it: ``errors`` (ClickHouse's error answers), ``statements`` (where an
insert's data begins), ``limits`` (roles and what a request may use), ``guard/`` (the statement guard: what a role
may run, decided from ClickHouse's own parser), ``engine`` (chDB: its directory, handles and statements),
``verdicts`` (the guard as the server applies it), ``bodies`` (decompressed request bodies), ``asgi`` (ClickHouse's
HTTP interface), ``connections`` (uvicorn's protocol and server), ``process`` (puts them together and runs them;
:func:`child` starts it for tests and benches).
"""

from store.server.process import child, main, run, serve, users_of

__all__ = ["child", "main", "run", "serve", "users_of"]
