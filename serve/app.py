"""`rstar2 serve`: an OpenAI-compatible API whose server runs the Python tool itself.

- POST /v1/chat/completions without `tools`: the server runs the agent loop (generate, run the Python tool in the
  sandbox, continue); the whole trajectory rides along in the message's `rstar2` extension field. With `tools`: a
  standard server: one generation, the client's calls returned as `tool_calls` for the client to run (`tool`
  messages are accepted); `tool_choice` "required" or named is enforced by guided decoding on an engine that
  constrains (vllm). Both forms split the reasoning from the answer (`reasoning_content`) and, streamed, send
  content, reasoning and call deltas as they are generated, through one parser (serve/reply_stream.py).
- POST /v1/responses (responses.py): the Responses API, `code_interpreter` run by the server's sandbox.
- POST /v1/completions: text or token ids in, text, token ids and logprobs out (what the `openai` engine uses).
- GET /v1/models, /health, /metrics (Prometheus).

What keeps the server up when one client misbehaves (the body limit, the header and body deadlines, the key check,
the per-client budgets) is in guard.py; docs/serve.md has the threat model.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException

from rstar2_agent.engines.base import EngineError
from rstar2_agent.trajectory import Trajectory

from .guard import (
    MAX_JSON_DEPTH,
    BodyTooLarge,
    current_client,
    key_digest,
    key_matches,
    read_body,
    replay,
    route_label,
    too_deep,
)
from .protocol import ChatRequest, CompletionRequest, OpenAIError, new_id, now, validation_error
from .reply_stream import (
    Delta,
    LoopReader,
)
from .responses import add_responses_routes
from .server import (
    Server,
    delta_of,
    engine_failure,
    finish_of,
    sse,
    tool_call_dict,
    trajectory_extension,
    until_done_or_gone,
)
from .watchdog import current_request

log = logging.getLogger(__name__)



class Guard:
    """ASGI middleware in front of every route: the API key (on every path when one is set, /health and /metrics
    too unless they are public), the request body read here under its size limit (413 as soon as it is passed,
    never buffered whole) and its JSON nesting checked, a client past its sandbox-time budget refused (429), and each
    request counted by route and status with its latency (to the last byte of a stream). Plain ASGI rather than
    Starlette's BaseHTTPMiddleware, which hides a client's disconnect from the endpoint (a non-streaming request
    would then run on for a client that has gone)."""

    LOOP_ROUTES = ("/v1/chat/completions", "/v1/responses")  # the routes that run code

    def __init__(self, app: Any, server: Server, router: Any):
        self.app, self.server, self.router = app, server, router
        cfg = server.cfg
        self.digest = key_digest(cfg.api_key) if cfg.api_key else None
        self.public = {p for p, public in (("/health", cfg.public_health), ("/metrics", cfg.public_metrics)) if public}
        self.limit = int(cfg.max_body_mb * 2**20)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        m, route = self.server.metrics, route_label(self.router.routes, scope)
        client = scope.get("client")
        token = current_client.set(client[0] if client else "-")
        t0, status = time.monotonic(), ["500"]

        async def counted_send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                status[0] = str(message["status"])
            await send(message)

        async def refuse(err: OpenAIError, headers: dict[str, str] | None = None) -> None:
            await JSONResponse(err.body(), status_code=err.status, headers=headers)(scope, receive, counted_send)

        try:
            headers = dict(scope.get("headers") or [])
            if self.digest is not None and scope["path"] not in self.public and \
                    not key_matches(headers.get(b"authorization"), self.digest):
                return await refuse(OpenAIError(401, "Incorrect or missing API key: send `Authorization: Bearer "
                                                     "<key>`.", code="invalid_api_key", kind="authentication_error"))
            if scope["method"] not in ("POST", "PUT", "PATCH"):
                return await self.app(scope, receive, counted_send)
            too_large = OpenAIError(413, f"The request body is larger than this server's limit of "
                                         f"{self.server.cfg.max_body_mb:g} MiB (rstar2 serve --max-body-mb).",
                                    code="request_too_large")
            length = headers.get(b"content-length", b"")
            if length.isdigit() and int(length) > self.limit:
                return await refuse(too_large)  # before a byte of it is read (uvicorn drains the rest unbuffered)
            try:
                body = await read_body(receive, self.limit)
            except BodyTooLarge:
                return await refuse(too_large)
            if body is None:  # the client went away
                return
            if await self.server.off_loop(too_deep, body) if len(body) > 2**20 else too_deep(body):
                return await refuse(OpenAIError(400, "The request body nests JSON arrays and objects more than "
                                                     f"{MAX_JSON_DEPTH} deep; flatten it.", code="invalid_json"))
            budgets = self.server.budgets
            if route in self.LOOP_ROUTES and budgets.tool_time_left() <= 0:
                wait = budgets.retry_after()
                return await refuse(OpenAIError(429, f"This client has spent its sandbox time ({budgets.tool_seconds:g}"
                                                     f" s a minute); retry in {wait} s.", code="rate_limit_exceeded",
                                                kind="rate_limit_error"), {"retry-after": str(wait)})
            await self.app(scope, replay(body, receive), counted_send)
        finally:
            m.requests.labels(route, status[0]).inc()
            m.latency.labels(route).observe(time.monotonic() - t0)
            current_client.reset(token)


def create_app(server: Server, *, manage: bool = True) -> FastAPI:
    """The ASGI app. With `manage` it starts the sandbox at startup and closes it and the engine at shutdown."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        if manage:
            await server.sandbox.start()
        try:
            yield
        finally:
            if manage:
                await server.sandbox.close()
                await server.engine.close()

    app = FastAPI(title="rstar2 serve", lifespan=lifespan)
    m = server.metrics

    @app.exception_handler(OpenAIError)
    async def _openai_error(request: Request, exc: OpenAIError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse(validation_error(exc.errors()).body(), status_code=400)

    @app.exception_handler(HTTPException)
    async def _http(request: Request, exc: HTTPException) -> JSONResponse:  # unknown routes, unparsable bodies
        err = OpenAIError(exc.status_code, str(exc.detail), code="not_found" if exc.status_code == 404 else None)
        return JSONResponse(err.body(), status_code=exc.status_code, headers=exc.headers)

    @app.exception_handler(EngineError)
    async def _engine_failed(request: Request, exc: EngineError) -> JSONResponse:
        err = engine_failure(exc)
        return JSONResponse(err.body(), status_code=err.status)

    app.add_middleware(Guard, server=server, router=app.router)


    add_responses_routes(app, server)

    @app.get("/health")
    async def health() -> JSONResponse:
        """200 while the engine makes progress; 503 with status "stalled" when requests are in flight and none of
        them has had a token for the stall timeout."""
        progress = server.engine.progress()
        out = {"status": "stalled" if progress["stalled"] else "ok", "model": server.cfg.model_name,
               "progress": progress, "sandbox": await server.sandbox.stats()}
        if engine_stats := server.engine.stats():  # vLLM's scheduler load; a replica pool: each replica's load
            out["engine"] = engine_stats
        return JSONResponse(out, status_code=503 if progress["stalled"] else 200)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(m.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": server.cfg.model_name, "object": "model", "created": now(),
                                            "owned_by": "rstar2", "max_model_len": server.engine.context_length}]}

    @app.post("/v1/chat/completions")
    async def chat(req: ChatRequest, request: Request):
        server.check_model(req.model)
        server.check_caps(req)
        constraint = server.forced_call(req)  # refused before anything runs
        prompt = await server.render(server.format_for(req), req.messages, req.tools,  # once per request
                                     (req.chat_template_kwargs or {}).get("problem_prefix", True))
        server.check_fits(prompt, req.budget(), "messages", req.budget_param())
        cid = new_id("chatcmpl")
        current_request.set(cid)  # the tasks below inherit it: a stall names the request
        if req.stream:
            return StreamingResponse(stream_chat(server, req, cid, prompt, constraint),
                                     media_type="text/event-stream")
        with m.in_flight.track_inprogress():
            if req.tools:
                results = await until_done_or_gone(request, asyncio.gather(
                    *(server.run_client_tools(req, i, prompt, constraint=constraint) for i in range(req.n))))
                choices = [{"index": i, "message": msg, "finish_reason": fin, "logprobs": None}
                           for i, (msg, fin, _, _, _) in enumerate(results)]
                usage = _usage(results[0][2], sum(r[3] for r in results))
            else:
                trajs = await until_done_or_gone(request, asyncio.gather(
                    *(server.run_loop(req, i, prompt) for i in range(req.n))))
                choices = [{"index": i, "message": server.loop_message(t, req, prompt), "finish_reason": finish_of(t),
                            "logprobs": _chat_logprobs(server, t) if req.logprobs else None}
                           for i, t in enumerate(trajs)]
                usage = _usage(len(prompt), sum(t.num_generated_tokens for t in trajs))
        return {"id": cid, "object": "chat.completion", "created": now(), "model": server.cfg.model_name,
                "choices": choices, "usage": usage}

    @app.post("/v1/completions")
    async def completions(req: CompletionRequest, request: Request):
        server.check_model(req.model)
        tok = server.engine.tokenizer
        prompt = list(req.prompt) if isinstance(req.prompt, list) else await server.off_loop(tok.encode, req.prompt)
        server.check_token_ids(prompt, "prompt")
        server.check_token_ids(req.stop_token_ids or [], "stop_token_ids")
        server.check_fits(prompt, req.max_tokens, "prompt", "max_tokens")
        cid = new_id("cmpl")
        current_request.set(cid)
        if req.stream:
            return StreamingResponse(stream_completion(server, req, prompt, cid), media_type="text/event-stream")
        with m.in_flight.track_inprogress():
            gens = await until_done_or_gone(request, asyncio.gather(
                *(_complete(server, req, prompt, i) for i in range(req.n))))
        choices = [_completion_choice(server, req, i, g.token_ids, g.logprobs, g.finish_reason, g.stop_text)
                   for i, g in enumerate(gens)]
        return {"id": cid, "object": "text_completion", "created": now(), "model": server.cfg.model_name,
                "choices": choices, "usage": _usage(len(prompt), sum(len(g.token_ids) for g in gens))}

    return app


# ---------------------------------------------------------------------------------------------- streaming
async def stream_chat(server: Server, req: ChatRequest, cid: str, prompt: list[int],
                      constraint: dict[str, Any] | None = None) -> AsyncIterator[str]:
    m = server.metrics
    current_request.set(cid)
    base = {"id": cid, "object": "chat.completion.chunk", "created": now(), "model": server.cfg.model_name}
    queue: asyncio.Queue = asyncio.Queue()
    t0 = time.monotonic()
    first = [True]
    include_usage, continuous = req.usage_in_stream()
    tokens, ended = [0] * req.n, [False] * req.n  # each choice's generated tokens so far; the choices that ended

    def chunk(index: int, delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        out = {**base, "choices": [{"index": index, "delta": delta, "finish_reason": finish, "logprobs": None}]}
        if continuous:  # as vLLM: the prompt and this choice's tokens so far
            out["usage"] = _usage(len(prompt), tokens[index])
        return out

    async def one(index: int) -> None:
        eos, split = server.format_for(req).eos_text, server.splits(req)
        reader = LoopReader(server.reply_parser(req, prompt, loop=True), eos)
        engine = Counted(server.engine, tokens, index) if continuous else None

        def put(deltas: list[Delta]) -> None:
            for d in deltas:
                queue.put_nowait(chunk(index, delta_of(d)))

        def on_event(kind: str, payload: Any) -> None:
            if split:  # a turn's text goes before its calls' activity
                put(reader.event(kind, payload))
            elif kind == "text" and (text := payload.replace(eos, "")):
                queue.put_nowait(chunk(index, {"content": text}))
            if kind in ("tool_call", "tool_result"):
                queue.put_nowait(chunk(index, {"rstar2": {kind: tool_call_dict(payload)}}))

        try:
            if req.tools:
                _, finish, _, tokens[index], _ = await server.run_client_tools(req, index, prompt, on_deltas=put,
                                                                               constraint=constraint, engine=engine)
                ended[index] = True
                queue.put_nowait(chunk(index, {}, finish))
            else:
                traj = await server.run_loop(req, index, prompt, on_event, engine=engine)
                if split:
                    put(reader.finish())
                tokens[index], ended[index] = traj.num_generated_tokens, True
                queue.put_nowait(chunk(index, {"rstar2": {k: v for k, v in trajectory_extension(traj).items()
                                                          if k != "turns"}}, finish_of(traj)))
        except OpenAIError as e:
            queue.put_nowait({"error": e.body()["error"]})
        except EngineError as e:
            queue.put_nowait({"error": engine_failure(e).body()["error"]})
        except Exception as e:  # noqa: BLE001 - never leave the stream waiting for a choice that died
            log.exception("request %s failed", cid)
            queue.put_nowait({"error": OpenAIError(500, f"{cid} failed: {type(e).__name__}: {e}",
                                                   kind="server_error").body()["error"]})

    m.in_flight.inc()
    tasks = [asyncio.create_task(one(i)) for i in range(req.n)]
    done = asyncio.gather(*tasks)
    getter: asyncio.Future | None = None
    try:
        for i in range(req.n):
            yield sse(chunk(i, {"role": "assistant", "content": ""}))
        while True:
            getter = asyncio.ensure_future(queue.get())
            finished, _ = await asyncio.wait({getter, done}, return_when=asyncio.FIRST_COMPLETED)
            if getter in finished:
                item = getter.result()
                delta = item["choices"][0]["delta"] if "choices" in item else {}
                if first[0] and (delta.get("content") or delta.get("reasoning_content") or delta.get("tool_calls")):
                    m.ttft.observe(time.monotonic() - t0)
                    first[0] = False
                yield sse(item)
                continue
            getter.cancel()
            while not queue.empty():
                yield sse(queue.get_nowait())
            break
        if include_usage and all(ended):  # as OpenAI and vLLM: no choices, the whole request's usage
            yield sse({**base, "choices": [], "usage": _usage(len(prompt), sum(tokens))})
        yield "data: [DONE]\n\n"
    finally:  # a client that went away cancels its generation and its sandbox work
        if getter is not None:
            getter.cancel()
        for t in tasks:
            t.cancel()
        with contextlib.suppress(BaseException):
            await done
        m.in_flight.dec()


async def stream_completion(server: Server, req: CompletionRequest, prompt: list[int], cid: str) -> AsyncIterator[str]:
    """Each chunk carries the new tokens' text, ids and logprobs; the last one the finish reason."""
    base = {"id": cid, "object": "text_completion", "created": now(), "model": server.cfg.model_name}
    queue: asyncio.Queue = asyncio.Queue()
    current_request.set(cid)
    include_usage, continuous = req.usage_in_stream()
    tokens = [0] * req.n

    def chunk(index: int, choice: dict[str, Any]) -> dict[str, Any]:
        out = {**base, "choices": [choice]}
        if continuous:
            out["usage"] = _usage(len(prompt), tokens[index])
        return out

    async def one(index: int) -> None:
        try:
            gen = await _complete(server, req, prompt, index, lambda ids, lps: queue.put_nowait((index, ids, lps)))
            queue.put_nowait((index, gen, None))
        except EngineError as e:
            queue.put_nowait((index, engine_failure(e), None))
        except Exception as e:  # noqa: BLE001 - never leave the stream waiting for a choice that died
            log.exception("request %s failed", cid)
            queue.put_nowait((index, OpenAIError(500, f"{cid} failed: {type(e).__name__}: {e}", kind="server_error"),
                              None))

    server.metrics.in_flight.inc()
    tasks = [asyncio.create_task(one(i)) for i in range(req.n)]
    pending, finished = set(range(req.n)), 0
    try:
        while pending:
            index, item, lps = await queue.get()
            if isinstance(item, OpenAIError):
                yield sse({"error": item.body()["error"]})
                pending.discard(index)
            elif isinstance(item, list):
                tokens[index] += len(item)
                yield sse(chunk(index, _completion_choice(server, req, index, item, lps, None, None)))
            else:
                tokens[index] = len(item.token_ids)
                yield sse(chunk(index, _completion_choice(server, req, index, [], [], item.finish_reason,
                                                          item.stop_text)))
                pending.discard(index)
                finished += 1
        if include_usage and finished == req.n:
            yield sse({**base, "choices": [], "usage": _usage(len(prompt), sum(tokens))})
        yield "data: [DONE]\n\n"
    finally:  # a client that went away cancels its generation
        for t in tasks:
            t.cancel()
        with contextlib.suppress(BaseException):
            await asyncio.gather(*tasks)
        server.metrics.in_flight.dec()


class Counted:
    """An engine as one streamed choice sees it: each token it hands on is first counted in `tokens[index]` (the
    usage so far, for stream_options.continuous_usage_stats)."""

    def __init__(self, engine: Any, tokens: list[int], index: int):
        self.engine, self.tokens, self.index = engine, tokens, index

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)

    async def generate(self, prompt_ids: list[int], sampling: Any, on_tokens: Any = None) -> Any:
        def counted(ids: list[int], logprobs: list[float] | None = None) -> None:
            self.tokens[self.index] += len(ids)
            on_tokens(ids, logprobs)

        return await self.engine.generate(prompt_ids, sampling, counted if on_tokens is not None else None)


# ---------------------------------------------------------------------------------------------- completions
async def _complete(server: Server, req: CompletionRequest, prompt: list[int], index: int, on_tokens=None):
    budget = min(req.max_tokens or 16, server.engine.context_length - len(prompt))
    sampling = server.sampling(req, index, budget, stop_token_ids=req.stop_token_ids or [], ignore_eos=req.ignore_eos)
    async with server.gate:
        gen = await server.engine.generate(prompt, sampling, on_tokens)
    server.metrics.tokens.labels("prompt").inc(len(prompt))
    server.metrics.tokens.labels("completion").inc(len(gen.token_ids))
    return gen


def _completion_choice(server: Server, req: CompletionRequest, index: int, ids: list[int], logprobs: list[float],
                       finish: str | None, stop_text: str | None) -> dict[str, Any]:
    tok = server.engine.tokenizer
    text = tok.decode(ids, skip_special_tokens=req.skip_special_tokens)
    if stop_text and not req.include_stop_str_in_output and stop_text in text:
        text = text[: text.rfind(stop_text)]
    choice: dict[str, Any] = {"index": index, "text": text, "finish_reason": finish, "logprobs": None,
                              "stop_reason": stop_text}
    if req.return_token_ids:
        choice["token_ids"] = list(ids)
    if req.logprobs is not None:
        tokens = [f"token_id:{i}" for i in ids] if req.return_tokens_as_token_ids else \
            [tok.decode([i], skip_special_tokens=False) for i in ids]
        choice["logprobs"] = {"tokens": tokens, "token_logprobs": list(logprobs), "top_logprobs": None,
                              "text_offset": []}
    return choice


def _chat_logprobs(server: Server, traj: Trajectory) -> dict[str, Any]:
    tok = server.engine.tokenizer
    return {"content": [{"token": tok.decode([i], skip_special_tokens=False), "logprob": lp, "bytes": None,
                         "top_logprobs": []}
                        for i, lp, keep in zip(traj.response_ids, traj.logprobs, traj.response_mask, strict=True)
                        if keep]}


def _usage(prompt: int, completion: int) -> dict[str, int]:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
