"""The error a request gets, as OpenAI's API shapes it: `{"error": {"message", "type", "param", "code"}}`.

`ApiError` carries the HTTP status with the body; `error_body` builds the body. The types are OpenAI's names
(`invalid_request_error`, `authentication_error`, `rate_limit_error`, `server_error`). This file decides no status
on its own: requests.py, app.py and worker.py raise these where they find the fault.
"""

from __future__ import annotations

from typing import Optional

TYPE_BY_STATUS = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
                  405: "invalid_request_error", 413: "invalid_request_error", 429: "rate_limit_error",
                  500: "server_error", 503: "server_error"}


class ApiError(Exception):
    """A request the server answers with an error: status, one-line message, the parameter at fault, a code."""

    def __init__(self, status: int, message: str, param: Optional[str] = None, code: Optional[str] = None,
                 headers: Optional[dict[str, str]] = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict:
        return error_body(self.status, self.message, self.param, self.code)


def error_body(status: int, message: str, param: Optional[str] = None, code: Optional[str] = None) -> dict:
    kind = TYPE_BY_STATUS.get(status, "invalid_request_error" if status < 500 else "server_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def one_line(error: BaseException) -> str:
    """An exception as one line: its type and first line of message."""
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0]}" if text else type(error).__name__
