"""Request bodies: the decompressors of the ``Content-Encoding``s ClickHouse accepts, run in bounded steps."""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterator
from typing import Any

from store.server.errors import StoreError


def decompressor(encoding: str) -> Callable[[], Any] | None:
    """A factory of incremental decompressors with ``decompress(data, max_length)``, ``eof``, ``unused_data`` and
    ``needs_input`` (concatenated frames/members each get a new one)."""
    if encoding in ("", "identity"):
        return None
    if encoding == "lz4":
        import lz4.frame

        return lz4.frame.LZ4FrameDecompressor
    if encoding == "zstd":
        from clickhouse_connect.driver.compression import _zstd_decompressor

        return _zstd_decompressor
    if encoding in ("gzip", "x-gzip"):
        return lambda: _Zlib(zlib.decompressobj(wbits=31))
    if encoding == "deflate":
        return lambda: _Zlib(zlib.decompressobj())
    raise StoreError.of(36, "BAD_ARGUMENTS", f"Unsupported Content-Encoding: {encoding}", 415)


class _Zlib:
    """zlib's decompressobj with the interface of lz4/zstd's incremental decompressors."""

    def __init__(self, obj: Any) -> None:
        self._obj = obj

    def decompress(self, data: bytes, max_length: int) -> bytes:
        return self._obj.decompress(self._obj.unconsumed_tail + data, max_length)

    @property
    def needs_input(self) -> bool:
        return not self._obj.unconsumed_tail

    @property
    def eof(self) -> bool:
        return self._obj.eof

    @property
    def unused_data(self) -> bytes:
        return self._obj.unused_data


STEP = 1 << 20
"""Decompressed bytes produced per step: a small input cannot make one step allocate much (a zip bomb)."""


def inflate(make: Callable[[], Any], chunk: bytes, state: list[Any]) -> Iterator[bytes]:
    """The decompressed bytes of ``chunk``, continuing the stream in ``state`` ([decompressor])."""
    data = chunk
    while True:
        if state[0] is None:
            state[0] = make()
        dec = state[0]
        try:
            out = dec.decompress(data, STEP)
        except Exception as exc:  # lz4/zstd/zlib each raise their own kind
            raise StoreError.of(271, "CANNOT_DECOMPRESS", f"Cannot decompress the request body: {exc}") from None
        data = b""
        if out:
            yield out
        if dec.eof:
            rest = dec.unused_data
            state[0] = None
            if not rest:
                return
            data = rest
        elif dec.needs_input:
            return
