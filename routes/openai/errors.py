"""OpenAI's error body and status codes, so official clients raise the right exception class.

Clients (the `openai` package, LangChain, open-webui) branch on the HTTP status and read
`error.message`; FastAPI's default 422 with a `detail` list would surface as an opaque error.
"""

from __future__ import annotations

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    429: "rate_limit_error",
    500: "server_error",
    503: "service_unavailable",
}


class APIError(Exception):
    """Raised anywhere in a request handler; becomes `{"error": {...}}` with `status`."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: dict | None = None,
    ):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.headers = headers or {}

    def body(self) -> dict:
        return error_body(self.status, self.message, self.param, self.code)


def error_body(
    status: int, message: str, param: str | None = None, code: str | None = None
) -> dict:
    return {
        "error": {
            "message": message,
            "type": _TYPES.get(status, "server_error"),
            "param": param,
            "code": code if code is not None else status,
        }
    }


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    errs = exc.errors()
    if not errs:
        return "invalid request", None
    e = errs[0]
    loc = [str(p) for p in e.get("loc", ()) if p != "body"]
    param = ".".join(loc) or None
    msg = e.get("msg", "invalid value")
    if e.get("type") == "json_invalid":
        return "the request body is not valid JSON", None
    return (f"{param}: {msg}" if param else msg), param


def install_error_handlers(app) -> None:
    """Map our APIError, body validation failures and stray errors onto OpenAI's shape."""

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError):
        return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError):
        message, param = _validation_message(exc)
        return JSONResponse(error_body(400, message, param, "invalid_value"), status_code=400)

    @app.exception_handler(404)
    async def _not_found(request: Request, exc):
        return JSONResponse(
            error_body(
                404, f"unknown endpoint {request.method} {request.url.path}", code="unknown_url"
            ),
            status_code=404,
        )

    @app.exception_handler(405)
    async def _bad_method(request: Request, exc):
        return JSONResponse(
            error_body(405, f"method {request.method} not allowed on {request.url.path}"),
            status_code=405,
        )
