"""Errors answered the way ClickHouse answers them: ``Code: N. DB::Exception: … (NAME)`` with the HTTP status
ClickHouse gives that error, and the client that left mid-request."""

from __future__ import annotations

# ClickHouse's exceptionCodeToHTTPStatus (src/Server/HTTP/exceptionCodeToHTTPStatus.cpp), by error name.
_STATUS_BY_ERROR = {
    **dict.fromkeys(("REQUIRED_PASSWORD",), 401),
    **dict.fromkeys(("UNKNOWN_USER", "WRONG_PASSWORD", "AUTHENTICATION_FAILED", "SET_NON_GRANTED_ROLE",
                     "ACCESS_DENIED", "READONLY"), 403),
    **dict.fromkeys((
        "BAD_ARGUMENTS", "CANNOT_COMPILE_REGEXP", "CANNOT_PARSE_TEXT", "CANNOT_PARSE_ESCAPE_SEQUENCE",
        "CANNOT_PARSE_QUOTED_STRING", "CANNOT_PARSE_DATE", "CANNOT_PARSE_DATETIME", "CANNOT_PARSE_NUMBER",
        "CANNOT_PARSE_DOMAIN_VALUE_FROM_STRING", "CANNOT_PARSE_IPV4", "CANNOT_PARSE_IPV6",
        "CANNOT_PARSE_INPUT_ASSERTION_FAILED", "CANNOT_PARSE_UUID", "DUPLICATE_COLUMN", "ILLEGAL_COLUMN",
        "UNKNOWN_ELEMENT_IN_AST", "UNKNOWN_TYPE_OF_AST_NODE", "THERE_IS_NO_COLUMN", "TOO_DEEP_AST", "TOO_BIG_AST",
        "UNEXPECTED_AST_STRUCTURE", "SYNTAX_ERROR", "INCORRECT_DATA", "TYPE_MISMATCH",
        "VALUE_IS_OUT_OF_RANGE_OF_DATA_TYPE", "CANNOT_DECOMPRESS",
        "SUPPORT_IS_DISABLED", "SETTING_CONSTRAINT_VIOLATION", "NO_DATA_TO_INSERT"), 400),   # (bad input)
    # A query parameter missing or of the wrong type is the client's input too (ClickHouse answers 500 for it;
    # this store answers no hostile input with a 5xx).
    **dict.fromkeys(("UNKNOWN_QUERY_PARAMETER", "BAD_QUERY_PARAMETER"), 400),
    **dict.fromkeys((
        "UNKNOWN_TABLE", "UNKNOWN_FUNCTION", "UNKNOWN_IDENTIFIER", "UNKNOWN_TYPE", "UNKNOWN_STORAGE",
        "UNKNOWN_DATABASE", "UNKNOWN_SETTING", "UNKNOWN_DIRECTION_OF_SORTING", "UNKNOWN_AGGREGATE_FUNCTION",
        "UNKNOWN_FORMAT", "UNKNOWN_DATABASE_ENGINE", "UNKNOWN_TYPE_OF_QUERY", "UNKNOWN_ROLE"), 404),
    "QUERY_IS_TOO_LARGE": 413, "NOT_IMPLEMENTED": 501, "SOCKET_TIMEOUT": 503, "CANNOT_OPEN_FILE": 503,
    "HTTP_LENGTH_REQUIRED": 411, "TIMEOUT_EXCEEDED": 408, "CANNOT_SCHEDULE_TASK": 503,
    "UNSUPPORTED_MEDIA_TYPE": 415, "TOO_MANY_SIMULTANEOUS_QUERIES": 503, "TOO_MANY_ROWS_OR_BYTES": 500,
    "UNSUPPORTED_METHOD": 405,
}


class StoreError(Exception):
    """An error answered the way ClickHouse answers it: ``Code: N. DB::Exception: … (NAME)``."""

    def __init__(self, message: str, code: int, name: str, status: int | None = None) -> None:
        super().__init__(message)
        self.message, self.code, self.name, self._status = message, code, name, status

    @classmethod
    def of(cls, code: int, name: str, text: str, status: int | None = None) -> StoreError:
        return cls(f"Code: {code}. DB::Exception: {text}. ({name})", code, name, status)

    @classmethod
    def from_chdb(cls, exc: Exception) -> StoreError:
        text = str(exc)
        text = text[text.find("Code: "):].strip() if "Code: " in text else text.strip()
        code, name = _error_code(text)
        if code is None:
            return cls.of(1000, "POCO_EXCEPTION", text or type(exc).__name__)   # ClickHouse's "unknown" family
        return cls(text, code, name)

    @property
    def status(self) -> int:
        return self._status or _STATUS_BY_ERROR.get(self.name, 500)


def _error_code(text: str) -> tuple[int | None, str]:
    """``Code: N. … (NAME)`` → (N, NAME), with string methods: the text may hold a client's query."""
    if not text.startswith("Code: "):
        return None, ""
    digits = text[6:6 + 12].split(".", 1)[0]
    if not digits.isdigit():
        return None, ""
    tail = text.rstrip()
    name = ""
    if tail.endswith(")"):
        candidate = tail[tail.rfind("(") + 1:-1]
        if candidate and all(c.isupper() or c.isdigit() or c == "_" for c in candidate):
            name = candidate
    return int(digits), name


def refused(status: int, text: str) -> StoreError:
    """A request refused before it reaches chDB (ClickHouse answers these with ACCESS_DENIED or its HTTP code)."""
    return StoreError.of(497, "ACCESS_DENIED", text, status)


class ClientGone(Exception):
    """The client closed the connection before its request was complete."""
