"""The HTTP gateway: ``POST /v1/events`` for apps that cannot use the SDK, and OpenTelemetry's OTLP/HTTP.

``app`` (the FastAPI application and its server), ``service`` (what the routes share: tokens, body reading, the
Kafka write path), ``batches`` (parsing and validating a request's events, with ``validation``), ``kafka`` (the
transactional producer), ``rate_limits``, ``wire`` (the answers' shapes), and ``otlp/`` (OTLP/HTTP decoding,
mapping and routes). Run it with ``python -m ingest.gateway``.
"""
