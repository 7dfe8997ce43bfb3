"""A refused statement as ClickHouse would answer it: its error code and name, its message, its HTTP status; and a
ClickHouse error raised by the parser read back as one."""

from __future__ import annotations

ACCESS_DENIED = (497, "ACCESS_DENIED")
READONLY = (164, "READONLY")
SYNTAX_ERROR = (62, "SYNTAX_ERROR")
QUERY_IS_TOO_LARGE = (229, "QUERY_IS_TOO_LARGE")
SETTING_CONSTRAINT_VIOLATION = (452, "SETTING_CONSTRAINT_VIOLATION")
TOO_DEEP_RECURSION = (306, "TOO_DEEP_RECURSION")
BAD_ARGUMENTS = (36, "BAD_ARGUMENTS")
UNKNOWN_FORMAT = (73, "UNKNOWN_FORMAT")

# What ClickHouse's HTTP handler answers for these codes (exceptionCodeToHTTPStatus); anything else is a 400.
_HTTP_STATUS = {497: 403, 164: 403, 229: 413}
_MESSAGE_LIMIT = 2_000


class Refused(Exception):
    """A statement the guard does not let through, with the ClickHouse error it answers as."""

    def __init__(self, code: int, name: str, message: str) -> None:
        super().__init__(f"Code: {code}. DB::Exception: {message}. ({name})")
        self.code = code
        self.name = name
        self.message = message

    @property
    def http_status(self) -> int:
        """The HTTP status ClickHouse would answer with: 403 (access), 413 (too large) or 400."""
        return _HTTP_STATUS.get(self.code, 400)


def refuse(message: str) -> Refused:
    """ACCESS_DENIED with ``message``: what a ClickHouse user without the grant is answered."""
    return Refused(*ACCESS_DENIED, message)


def clickhouse_error(text: str) -> Refused | None:
    """A ClickHouse error's code, name and message, from its text ``Code: N. DB::Exception: msg. (NAME)``."""
    start = text.find("Code: ")
    if start < 0:
        return None
    end = start + 6
    while end < len(text) and text[end].isdigit():
        end += 1
    if end == start + 6:
        return None
    code = int(text[start + 6:end])
    message = text[end:].lstrip(". ").removeprefix("DB::Exception: ")
    name = "UNKNOWN_EXCEPTION"
    close = message.rfind(")")
    open_ = message.rfind("(", 0, close) if close >= 0 else -1
    if open_ >= 0 and message[open_ + 1:close].replace("_", "").isalnum() and message[open_ + 1:close].isupper():
        name = message[open_ + 1:close]
        message = message[:open_].rstrip(" .")
    # The statement was wrapped in toValidUTF8(parseQueryToJSON(...)): that scope is the guard's, not the client's.
    cut = message.find("In scope SELECT toValidUTF8(parseQueryToJSON(")
    if cut >= 0:
        message = message[:cut].rstrip(" :.")
    return Refused(code, name, message[:_MESSAGE_LIMIT])
