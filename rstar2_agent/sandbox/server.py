"""`rstar2 sandbox serve`: the sandbox API over HTTP (JSON in/out), so GPU nodes can send calls to CPU nodes.

Endpoints: POST /run, POST /run_batch, POST /sessions, POST /sessions/{id}/run, DELETE /sessions/{id},
GET /health, GET /metrics (Prometheus text format).

Errors are {"error": {"message", "type", "param"}}: 400 for a body of the wrong shape (strict types: "code": 5
is not code), 413 for code, stdin or a batch over its cap, 404 for an unknown session, 429 for too many sessions.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

from fastapi import FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from .types import ExecRequest, ExecResult, Sandbox, SandboxError, unknown_session

MAX_BATCH = 4096
MAX_CODE_CHARS = 1 << 20
MAX_STDIN_CHARS = 16 << 20
MAX_TIMEOUT = 3600.0
_TOO_LARGE = ("string_too_long", "too_long")  # pydantic's error types for max_length
_KINDS = {400: "invalid_request_error", 404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error"}


class RunBody(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")  # a misspelt "timout" is an error, not the default

    code: str = Field(max_length=MAX_CODE_CHARS)
    stdin: str = Field(default="", max_length=MAX_STDIN_CHARS)
    timeout: float | None = Field(default=None, gt=0, le=MAX_TIMEOUT)  # seconds of wall time


class BatchBody(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")

    requests: list[RunBody] = Field(max_length=MAX_BATCH)


def error(status: int, message: str, param: str | None = None) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": _KINDS.get(status, "error"), "param": param}},
                        status_code=status)


def invalid_body(exc: RequestValidationError) -> JSONResponse:
    """400 (413 for a field over its cap) naming the field: "requests[3].timeout"."""
    first = exc.errors()[0] if exc.errors() else {}
    if first.get("type") == "json_invalid":
        return error(400, "The request body is not valid JSON.")
    param = ""
    for part in first.get("loc", ())[1:]:  # the first element is "body"
        param += f"[{part}]" if isinstance(part, int) else f".{part}" if param else str(part)
    if not param:
        return error(400, "The request body must be a JSON object (sent with Content-Type: application/json).")
    status = 413 if first.get("type") in _TOO_LARGE else 400
    return error(status, f"{param}: {first.get('msg', 'invalid value')}", param)


class _Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.calls = Counter("rstar2_sandbox_calls", "Sandbox calls by result status", ["status"],
                             registry=self.registry)
        self.latency = Histogram("rstar2_sandbox_call_seconds", "Call latency, queue wait included",
                                 buckets=(.002, .005, .01, .02, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60),
                                 registry=self.registry)
        self.in_flight = Gauge("rstar2_sandbox_in_flight", "Calls being served", registry=self.registry)
        self.sessions = Gauge("rstar2_sandbox_sessions", "Open sessions", registry=self.registry)

    def observe(self, result: ExecResult, seconds: float) -> None:
        self.calls.labels(status=str(result.status)).inc()
        self.latency.observe(seconds)


def create_app(sandbox: Sandbox, *, manage_lifecycle: bool = True) -> FastAPI:
    """An ASGI app serving `sandbox`. With manage_lifecycle the app starts and closes it."""
    metrics = _Metrics()

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        if manage_lifecycle:
            await sandbox.start()
        try:
            yield
        finally:
            if manage_lifecycle:
                await sandbox.close()

    app = FastAPI(title="rstar2 sandbox", lifespan=lifespan)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        return invalid_body(exc)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return error(exc.status_code, str(exc.detail))

    async def timed_run(body: RunBody) -> ExecResult:
        t0 = time.monotonic()
        metrics.in_flight.inc()
        try:
            result = await sandbox.run(body.code, body.stdin, body.timeout)
        finally:
            metrics.in_flight.dec()
        metrics.observe(result, time.monotonic() - t0)
        return result

    @app.post("/run")
    async def run(body: RunBody) -> dict[str, Any]:
        return (await timed_run(body)).to_dict()

    @app.post("/run_batch")
    async def run_batch(body: BatchBody) -> dict[str, Any]:
        t0 = time.monotonic()
        reqs = [ExecRequest(r.code, r.stdin, r.timeout) for r in body.requests]
        metrics.in_flight.inc(len(reqs))
        try:
            results = await sandbox.run_batch(reqs)
        finally:
            metrics.in_flight.dec(len(reqs))
        for r in results:
            metrics.observe(r, time.monotonic() - t0)
        return {"results": [r.to_dict() for r in results]}

    @app.post("/sessions")
    async def open_session() -> dict[str, str]:
        try:
            sid = await sandbox.open_session()
        except SandboxError as e:
            raise HTTPException(status_code=429, detail=str(e)) from e
        metrics.sessions.inc()
        return {"session_id": sid}

    @app.post("/sessions/{session_id}/run")
    async def run_in_session(session_id: str, body: RunBody) -> dict[str, Any]:
        t0 = time.monotonic()
        result = await sandbox.run_in_session(session_id, body.code, body.stdin, body.timeout)
        gone = unknown_session(session_id)
        if (result.status, result.stderr) == (gone.status, gone.stderr):
            raise HTTPException(status_code=404, detail=gone.stderr)
        metrics.observe(result, time.monotonic() - t0)
        return result.to_dict()

    @app.delete("/sessions/{session_id}")
    async def close_session(session_id: str) -> dict[str, bool]:
        await sandbox.close_session(session_id)
        metrics.sessions.dec()
        return {"closed": True}

    @app.get("/health")
    async def health() -> JSONResponse:
        stats = await sandbox.stats()
        healthy = stats.get("alive", 1) > 0
        return JSONResponse({"status": "ok" if healthy else "down", **stats}, status_code=200 if healthy else 503)

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return app
