"""The gateway's wire models: its JSON answers, a request refused as a whole, and the v1 envelope's schema for the
OpenAPI document (documentation only: events are validated by :mod:`ingest.gateway.validation`, not by these models)."""

from __future__ import annotations

from typing import Literal

from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from eventide.envelope import KINDS, LEVELS, MAX_APP_CHARS, MAX_DEVICE_CHARS, MAX_NAME_CHARS


class Rejection(BaseModel):
    """One event of the batch that was not written, and why (the stream job's dead-letter reason)."""

    index: int = Field(description="0-based position in the batch (NDJSON: among the non-blank lines)")
    id: str | None = Field(description="the event's id, when it has a string one")
    reason: str = Field(examples=["missing field: value", "event_time is after sent_time"])


class BatchResult(BaseModel):
    """Outcome of a batch: ``accepted`` events were written to Kafka (committed), ``rejected`` were not."""

    accepted: int
    rejected: list[Rejection]


class Problem(BaseModel):
    """A request refused as a whole; nothing from it was written."""

    error: Literal["unauthorized", "body_too_large", "too_many_events", "malformed_json", "rate_limited",
                   "request_timeout"]
    detail: str
    line: int | None = Field(None, description="malformed_json: 1-based line of the parse error")
    column: int | None = Field(None, description="malformed_json: 1-based column of the parse error")


class Unavailable(BaseModel):
    """Kafka did not take the batch. Retry the whole batch after ``Retry-After`` seconds."""

    error: Literal["unavailable"] = "unavailable"
    detail: str
    written: Literal["nothing", "unknown"] = Field(
        description="'nothing': the transaction was aborted or never began. 'unknown': the commit was sent but "
                    "not confirmed in time; the batch is then either entirely written or not at all")


class BrokerHealth(BaseModel):
    bootstrap: str
    reachable: bool
    events_topic: str
    events_topic_exists: bool
    detail: str | None = None


class Health(BaseModel):
    """``ok`` when the broker answers a metadata request and the events topic exists."""

    status: Literal["ok", "unavailable"]
    broker: BrokerHealth
    producers: int = Field(description="transactional producers (batches written concurrently)")
    producers_ready: int = Field(description="producers whose transactions are initialised")


class EnvelopeV1(BaseModel):
    """Event envelope v1 (documentation only: the gateway validates with the stream job's rules)."""

    model_config = ConfigDict(title="Envelope v1", extra="allow")

    v: Literal[1]
    id: str = Field(min_length=1, description="unique per event (UUIDv7 or ULID)")
    kind: Literal[KINDS]  # type: ignore[valid-type]
    app: str = Field(min_length=1, max_length=MAX_APP_CHARS)
    device: str = Field(min_length=1, max_length=MAX_DEVICE_CHARS, description="also the Kafka record key")
    name: str = Field(min_length=1, max_length=MAX_NAME_CHARS, description="metric name or logger name")
    value: float | None = Field(None, description="metrics: required, finite number")
    level: Literal[LEVELS] | None = Field(None, description="logs: required")  # type: ignore[valid-type]
    message: str | None = Field(None, description="logs: required")
    user: str | None = None
    tags: dict[str, str] | None = None
    event_time: int = Field(description="ms since the Unix epoch, device clock: when it happened")
    sent_time: int = Field(description="ms since the Unix epoch, device clock: when it was sent; >= event_time")
    received_time: int | None = Field(None, description="ignored: the gateway sets it (server clock)")


class RequestProblem(Exception):
    """A request refused as a whole before anything was written."""

    def __init__(self, status: int, problem: Problem, headers: dict[str, str] | None = None) -> None:
        super().__init__(problem.detail)
        self.status, self.problem, self.headers = status, problem, headers or {}

    def response(self) -> JSONResponse:
        return JSONResponse(self.problem.model_dump(exclude_none=True), self.status, headers=self.headers)
