"""Who a request runs as (the writer or the reader role) and what one request, and one user, may use
(``StoreConfig``)."""

from __future__ import annotations

from dataclasses import dataclass

from eventide.config import StoreConfig

WRITER, READER = "writer", "reader"


@dataclass(frozen=True)
class Limits:
    """What one request, and one user's requests together, may use (``StoreConfig``)."""

    max_query_size: int
    max_insert_bytes: int
    max_concurrent_queries: int
    receive_timeout_s: float
    caps: dict[str, float]
    allowed_hosts: frozenset[str]
    max_head_size: int
    max_concurrent_queries_for_user: int = 16
    """A user's queries from their start until their answer is sent (never more than ``max_concurrent_queries``)."""
    max_unsent_answer_bytes_for_user: int = 8 * 1024**2
    send_timeout_s: float = 30.0

    @classmethod
    def of(cls, store: StoreConfig) -> Limits:
        # Host with the port (what every HTTP client sends), or a loopback name alone: a DNS-rebound page's Host
        # is its own domain name, never one of these.
        hosts = {f"{store.host}:{store.port}"}
        if store.host in ("127.0.0.1", "localhost"):
            hosts |= {f"127.0.0.1:{store.port}", f"localhost:{store.port}", "127.0.0.1", "localhost"}
        if store.host in ("::1", "[::1]"):
            hosts |= {f"[::1]:{store.port}", f"localhost:{store.port}", "[::1]", "localhost"}
        return cls(store.max_query_size, store.max_insert_bytes, store.max_concurrent_queries,
                   store.http_receive_timeout_s,
                   {"max_execution_time": store.max_execution_time, "max_memory_usage": store.max_memory_usage,
                    "max_result_bytes": store.max_result_bytes}, frozenset(h.lower() for h in hosts),
                   store.http_max_field_value_size,
                   max_concurrent_queries_for_user=min(store.max_concurrent_queries,
                                                       store.max_concurrent_queries_for_user),
                   max_unsent_answer_bytes_for_user=store.max_unsent_answer_bytes_for_user,
                   send_timeout_s=store.http_send_timeout_s)
