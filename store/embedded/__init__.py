"""The embedded store's server, part by part; ``store/server.py`` puts them together and runs them
(``python -m store.server``, ``eventide store serve``).

Each part imports only those listed before it: ``errors`` (ClickHouse's error answers), ``statements`` (where an
insert's data begins), ``limits`` (roles and what a request may use), ``engine`` (chDB: its directory, handles and
statements), ``verdicts`` (the statement guard), ``bodies`` (decompressed request bodies), ``asgi`` (ClickHouse's
HTTP interface), ``connections`` (uvicorn's protocol and server).
"""
