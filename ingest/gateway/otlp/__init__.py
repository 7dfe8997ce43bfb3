"""OpenTelemetry's OTLP/HTTP on the gateway (``POST /v1/logs``, ``POST /v1/metrics``).

``wire`` decodes requests and encodes answers; ``mapping`` is what logs and metrics share on the way to v1
envelopes; ``logs`` and ``metrics`` map each signal; ``state`` is what is remembered between requests (clock
offsets, cumulative series); ``routes`` wires them into the gateway's app.
"""
