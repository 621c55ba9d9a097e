"""`rstar2 sandbox serve`: the sandbox API over HTTP (JSON in/out), so GPU nodes can send calls to CPU nodes.

Endpoints: POST /run, POST /run_batch, POST /sessions, POST /sessions/{id}/run, DELETE /sessions/{id},
GET /health, GET /metrics (Prometheus text format).
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

from fastapi import FastAPI, HTTPException
from fastapi.responses import JSONResponse, Response
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from pydantic import BaseModel, Field

from .types import ExecRequest, ExecResult, Sandbox, SandboxError

MAX_BATCH = 4096


class RunBody(BaseModel):
    code: str
    stdin: str = ""
    timeout: float | None = Field(default=None, gt=0, le=3600)


class BatchBody(BaseModel):
    requests: list[RunBody] = Field(max_length=MAX_BATCH)


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
