"""ClickHouse access for the stream job, the dashboard, the evaluator and the tests: the client path (``client``,
``credentials``, ``migrations``, ``pipeline``, ``range_query``); ``server/`` is the embedded store's server, a
process of its own that the client path reaches over HTTP and never imports."""
