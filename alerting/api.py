"""Silences over HTTP, as Alertmanager's API v2 serves them, so ``amtool`` and scripts written for it work:

    GET    /api/v2/silences           every silence (active, pending, expired), as ``GettableSilences``
    POST   /api/v2/silences           create one (``PostableSilence``; with an ``id``: replace it); {"silenceID": id}
    DELETE /api/v2/silence/{id}       expire it now

Every request needs ``Authorization: Bearer <token>`` with one of ``alerting.api_tokens`` (401 otherwise). The
alerting service serves it on ``alerting.api_host``:``alerting.api_port`` when the port is set (:func:`server_config`):
a request's headers and then its body each have ``alerting.api_request_timeout_s`` to arrive (408 after), and at
most ``alerting.api_max_connections`` connections are open.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import replace
from datetime import datetime
from typing import Any

import uvicorn
from clickhouse_connect.driver.exceptions import ClickHouseError
from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from alerting import silences
from alerting.alertmanager import go_time
from alerting.routes import Matcher
from eventide.config import Config, ConfigError
from eventide.envelope import ms_of, now_ms
from eventide.http_deadline import HeadDeadlineProtocol
from store.client import StoreUnavailable


class MatcherBody(BaseModel):
    """Alertmanager's matcher: a label, a value, whether the value is a regular expression and whether it must
    match (``isEqual``, default true)."""

    model_config = ConfigDict(extra="forbid")

    name: str
    value: str
    isRegex: bool     # Alertmanager's field names, as its clients send them
    isEqual: bool = True

    def text(self) -> str:
        op = ("=~" if self.isEqual else "!~") if self.isRegex else ("=" if self.isEqual else "!=")
        escaped = self.value.replace("\\", "\\\\").replace('"', '\\"')
        return f'{self.name}{op}"{escaped}"'


class SilenceBody(BaseModel):
    """Alertmanager's ``PostableSilence``."""

    model_config = ConfigDict(extra="forbid")

    id: str | None = None
    matchers: list[MatcherBody] = Field(min_length=1)
    startsAt: datetime
    endsAt: datetime
    createdBy: str
    comment: str



def _matcher_json(m: Matcher) -> dict[str, Any]:
    return {"name": m.name, "value": m.value, "isRegex": m.op in ("=~", "!~"), "isEqual": m.op in ("=", "=~")}


def gettable(silence: silences.Silence, at_ms: int) -> dict[str, Any]:
    """A silence as Alertmanager's ``GettableSilence``."""
    return {"id": silence.id, "status": {"state": silence.state(at_ms)}, "updatedAt": go_time(at_ms),
            "matchers": [_matcher_json(m) for m in silence.matchers], "startsAt": go_time(silence.starts_at_ms),
            "endsAt": go_time(silence.ends_at_ms), "createdBy": silence.created_by, "comment": silence.comment}


MAX_BODY_BYTES = 64 * 1024
"""Largest request body read (a silence is a few hundred bytes); a larger one is refused 413 unread."""


def create_app(config: Config) -> ASGIApp:
    """The silences API over the store of ``config``: a request is refused (401) before its body is read unless it
    carries a token, and (413) once its body passes :data:`MAX_BODY_BYTES`, so no client makes it read more."""
    tokens = [t.encode() for t in config.alerting.api_tokens]
    app = FastAPI(title="eventide alerting", docs_url=None, redoc_url=None, openapi_url=None)

    @app.exception_handler(ClickHouseError)
    @app.exception_handler(StoreUnavailable)
    def store_away(_request: Request, exc: Exception) -> JSONResponse:
        # The store's outage is not the client's fault, and passes: 503, as a ClickHouse server answers when busy.
        return JSONResponse(f"the store is unavailable: {type(exc).__name__}", status_code=503,
                            headers={"Retry-After": "5"})

    async def guarded(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        scheme, _, token = headers.get(b"authorization", b"").decode("latin-1").partition(" ")
        # Compared in constant time against every token: the answer's timing does not tell how much matched.
        if scheme.lower() != "bearer" or not any([hmac.compare_digest(token.encode("latin-1"), t) for t in tokens]):
            await _refuse(send, 401, "a bearer token of alerting.api_tokens is needed", {"WWW-Authenticate": "Bearer"})
            return
        length = headers.get(b"content-length", b"0")
        if not length.isdigit() or int(length) > MAX_BODY_BYTES:
            await _refuse(send, 413, f"a body of at most {MAX_BODY_BYTES} bytes")
            return
        read = 0
        loop = asyncio.get_running_loop()
        body_deadline = loop.time() + config.alerting.api_request_timeout_s

        async def capped() -> Message:
            nonlocal read
            try:
                message = await asyncio.wait_for(receive(), max(0.0, body_deadline - loop.time()))
            except TimeoutError:
                late = f"the body did not arrive within {config.alerting.api_request_timeout_s:g} s"
                raise HTTPException(408, f"{late} (alerting.api_request_timeout_s)",
                                    headers={"Connection": "close"}) from None
            read += len(message.get("body", b""))
            if read > MAX_BODY_BYTES:      # a chunked body longer than it said
                raise HTTPException(413, f"a body of at most {MAX_BODY_BYTES} bytes")
            return message

        await app(scope, capped, send)

    @app.get("/api/v2/silences")
    def list_silences() -> list[dict[str, Any]]:
        at = now_ms()
        return [gettable(s, at) for s in silences.listed(config, at, ended=True)]

    @app.post("/api/v2/silences")
    def post_silence(body: SilenceBody) -> JSONResponse:
        try:
            silence = silences.new_silence([m.text() for m in body.matchers], ms_of(body.startsAt), ms_of(body.endsAt),
                                           body.createdBy, body.comment)
        except ConfigError as exc:
            return JSONResponse(str(exc), status_code=400)
        if body.id:      # Alertmanager replaces a silence posted with its id
            if body.id not in {s.id for s in silences.listed(config, ended=True)}:
                return JSONResponse(f"silence {body.id!r} not found", status_code=404)
            silence = replace(silence, id=body.id)
        silences.save(config, silence)
        return JSONResponse({"silenceID": silence.id})

    @app.delete("/api/v2/silence/{silence_id}")
    def delete_silence(silence_id: str) -> JSONResponse:
        try:
            silences.expire(config, silence_id)
        except ConfigError as exc:
            return JSONResponse(str(exc), status_code=404 if "no such silence" in str(exc) else 400)
        return JSONResponse(None)

    return guarded


class _HeadDeadline(HeadDeadlineProtocol):
    """The silences API's deadline on a request's headers: a late client gets a JSON 408 and is disconnected."""

    def late_response(self) -> bytes:
        body = json.dumps({"detail": f"request headers not received within {self.head_timeout_s:g} s "
                                     "(alerting.api_request_timeout_s)"}).encode()
        return (b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
                b"connection: close\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body))


def server_config(config: Config) -> uvicorn.Config:
    """The silences API's uvicorn server: h11 with a deadline on the headers and a cap on connections (the body's
    deadline is :func:`create_app`'s), keep-alive connections closed after 5 s idle."""
    a = config.alerting
    protocol = type("SilencesHttp", (_HeadDeadline,), {"head_timeout_s": a.api_request_timeout_s,
                                                       "max_connections": a.api_max_connections})
    return uvicorn.Config(create_app(config), host=a.api_host, port=a.api_port, http=protocol, log_level="warning",
                          lifespan="off", timeout_keep_alive=5)


async def _refuse(send: Send, status: int, reason: str, headers: dict[str, str] | None = None) -> None:
    body = json.dumps({"detail": reason}).encode()
    await send({"type": "http.response.start", "status": status, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
        *[(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]]})
    await send({"type": "http.response.body", "body": body})


# A client of the API above (the Alerts page creates and expires silences through it) ------------------------------
def _request(config: Config, method: str, path: str, body: object = None) -> Any:
    a = config.alerting
    if not a.api_port or not a.api_tokens:
        raise ConfigError("the silences API is off: set alerting.api_port and alerting.api_tokens")
    request = urllib.request.Request(f"http://{a.api_host}:{a.api_port}/api/v2{path}", method=method,
                                     data=None if body is None else json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json",
                                              "Authorization": f"Bearer {a.api_tokens[0]}"})
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return json.load(answer)
    except urllib.error.HTTPError as error:
        raise ConfigError(f"silences API answered {error.code}: {error.read().decode(errors='replace')}") from None
    except OSError as error:
        raise ConfigError(f"silences API at {a.api_host}:{a.api_port} unreachable: {error}") from None


def request_silence(config: Config, matchers: list[str], duration_s: float, created_by: str, comment: str) -> str:
    """Create a silence from now through the API; its id. Raises :class:`ConfigError` with the API's reason."""
    try:
        parsed = [Matcher.parse(m) for m in matchers]
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    start = now_ms()
    answer = _request(config, "POST", "/silences", {
        "matchers": [_matcher_json(m) for m in parsed], "startsAt": go_time(start),
        "endsAt": go_time(start + round(duration_s * 1000)), "createdBy": created_by, "comment": comment})
    return str(answer["silenceID"])


def request_expiry(config: Config, silence_id: str) -> None:
    """Expire a silence through the API. Raises :class:`ConfigError` with the API's reason."""
    _request(config, "DELETE", f"/silence/{urllib.parse.quote(silence_id, safe='')}")
