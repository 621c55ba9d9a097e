"""POST /v1/responses (OpenAI's Responses API), GET and DELETE /v1/responses/{id}.

- With the `code_interpreter` tool (and no client functions) the server runs the agent loop, as chat completions
  without tools does, and returns its turns as output items: `reasoning`, `code_interpreter_call` (the code, the
  container, the program's logs) and `message`. In the rStar2 formats each call is the stateless Python tool the
  model was trained with, whatever `container` says; in the other formats the calls of one container share a
  sandbox session (docs/serve.md says how containers are named, reused and closed).
- With client `function` tools, or no tools: one generation; the calls it writes are `function_call` items for the
  client to run, answered by `function_call_output` items in the next request.
- `previous_response_id` continues a stored response's conversation; `stream` sends the Responses events.

The request shapes and output items are in responses_protocol.py; stored responses and containers in
responses_state.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import logging
import re
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse

from rstar2_agent.chat_format import FIXED_TEMPLATE, ChatFormat, default_extraction, extract_answer
from rstar2_agent.engines.base import EngineError
from rstar2_agent.sandbox.release_tool import RELEASE_TOOL
from rstar2_agent.sandbox.tools import STATELESS_TOOL
from rstar2_agent.trajectory import ToolCallRecord, Trajectory

from .protocol import ChatRequest, OpenAIError, new_id, now
from .reply_stream import Delta, LoopReader
from .responses_protocol import Output, ResponsesRequest, chat_call, input_messages, with_instructions
from .responses_state import Container, Containers, ContainerSandbox, ResponseStore, Stored
from .server import Server, engine_failure, sse, trajectory_extension, until_done_or_gone
from .watchdog import current_request

log = logging.getLogger(__name__)
# The Python tool's names (the paper's and the release's; each format answers both): the loop's reply parser takes
# their call blocks out of the text, which the code_interpreter_call items show instead. A block that is not a well
# formed call stays in the text, as the model wrote it, beside the failed call's item.
PYTHON_TOOLS = [{"name": STATELESS_TOOL}, {"name": RELEASE_TOOL}]
STATEFUL_NOTE = ("Each call runs in this conversation's persistent Python session (like a notebook): variables, "
                 "functions and imports of earlier calls are kept. Returns standard output and standard error; the "
                 "value of a final bare expression is printed.")


@dataclass
class CheckedResponse:
    """A checked request, ready to run: what the shared helpers read, the rendered prompt, the container."""

    req: ResponsesRequest
    chat: ChatRequest  # the request as Server's helpers read a chat request
    fmt: ChatFormat
    prompt: list[int]
    conversation: list[dict[str, Any]]  # the chat messages, instructions left out (stored for a continuation)
    loop: bool  # the server's code loop (code_interpreter), else one generation
    stateful: bool = False  # the loop's calls share the container's session
    container_id: str = ""
    container: Container | None = None  # the open container its calls run in, held while the request runs
    made: bool = False  # the container was made for this request
    done: bool = False  # the response was finished (returned, and stored if asked): its container is referred to
    id: str = field(default_factory=lambda: new_id("resp"))
    created: int = field(default_factory=now)


@dataclass
class ResponseRun:
    messages: list[dict[str, Any]]  # what this response adds to the conversation, as chat messages
    input_tokens: int
    output_tokens: int
    incomplete: str | None  # why the response stopped short (incomplete_details.reason), else None
    extension: dict[str, Any]  # the `rstar2` field: the trajectory


class Responses:
    """The endpoint's state beside the Server: stored responses and containers."""

    def __init__(self, server: Server):
        cfg = server.cfg
        self.server = server
        self.store = ResponseStore(cfg.max_stored_responses, int(cfg.max_stored_mb * 2**20))
        self.containers = Containers(server.sandbox, cfg.max_containers, cfg.container_idle_timeout)

    # ------------------------------------------------------------------ planning (every check before any work)
    async def plan(self, req: ResponsesRequest) -> CheckedResponse:
        """The checked request, its prompt rendered off the event loop, and its container held (a new one made:
        past the cap, a 429 before anything runs); `release` lets it go."""
        server = self.server
        server.check_model(req.model)
        prev = self.store.get(req.previous_response_id, "previous_response_id") if req.previous_response_id else None
        code, functions = req.code_tool(), req.function_tools()
        chat = chat_request(req, functions)
        server.check_caps(chat)
        fmt = server.format_for(chat)
        python_tool = fmt.tools[0].get("function", fmt.tools[0])["name"]
        conversation = (prev.messages if prev else []) + input_messages(req.input, python_tool)
        chat.messages = with_instructions(req.instructions, conversation)
        loop = code is not None and req.tool_choice != "none"
        stateful = loop and fmt.rules.name not in FIXED_TEMPLATE
        tools = ([stateful_schema(fmt.tools[0])] if stateful else None) if loop else functions
        prompt = await server.render(fmt, chat.messages, tools)
        server.check_fits(prompt, req.max_output_tokens, "input", "max_output_tokens")
        plan = CheckedResponse(req, chat, fmt, prompt, conversation, loop, stateful)
        if loop:
            spec, param = code["container"], f"tools[{req.tools.index(code)}].container"
            if not stateful:  # the rStar2 formats: the id is only reported
                plan.container_id = spec if isinstance(spec, str) else new_id("cntr")
            elif isinstance(spec, str):
                plan.container = self.containers.find(spec, param)
            else:
                plan.container = self.containers.alive(prev.container if prev else None)
            if plan.container is not None:
                plan.container.users += 1
            elif stateful:
                plan.container, plan.made = await self.containers.new(), True
            plan.container_id = plan.container.id if plan.container else plan.container_id or new_id("cntr")
        return plan

    def release(self, plan: CheckedResponse) -> None:
        """The request has ended: its container may expire from now on, or, made for a request that never finished,
        is closed now."""
        if plan.container is not None:
            self.containers.release(plan.container, reap=plan.made and not plan.done)
            plan.container = None

    # ------------------------------------------------------------------ running
    async def run(self, plan: CheckedResponse, out: Output) -> ResponseRun:
        return await (self.run_loop(plan, out) if plan.loop else self.run_once(plan, out))

    async def run_loop(self, plan: CheckedResponse, out: Output) -> ResponseRun:
        """The agent loop; its text parsed into reasoning and message items as it streams, each call an item."""
        reader = LoopReader(self.server.reply_parser(plan.chat, plan.prompt, tools=PYTHON_TOOLS), plan.fmt.eos_text)

        def on_event(kind: str, payload: Any) -> None:
            put_text(out, reader.event(kind, payload))  # a turn's text before its calls' items
            if kind == "tool_call":
                out.code_call(payload.id, code_of(payload), plan.container_id)
            elif kind == "tool_result":
                out.code_result(payload.id, logs_of(payload), payload.error is None and payload.status == "ok")

        sandbox = ContainerSandbox(self.containers, plan.container) if plan.container is not None else None
        traj = await self.server.run_loop(plan.chat, 0, plan.prompt, on_event, sandbox=sandbox)
        put_text(out, reader.finish())
        incomplete = {"max_tokens": "max_output_tokens", "max_turns": "max_turns"}.get(traj.stop_reason)
        return ResponseRun(turn_messages(traj, plan.fmt.eos_text), len(plan.prompt), traj.num_generated_tokens,
                           incomplete, trajectory_extension(traj))

    async def run_once(self, plan: CheckedResponse, out: Output) -> ResponseRun:
        """One generation (client functions, or no tools): its calls are function_call items for the client."""

        def on_deltas(deltas: list[Delta]) -> None:
            for d in deltas:
                if d.kind == "call":
                    out.function_call(d.index, d.id, d.name)
                elif d.kind == "arguments":
                    out.arguments(d.index, d.text)
                else:
                    out.text(d.kind, d.text)

        _, finish, n_prompt, n_out, gen = await self.server.run_client_tools(plan.chat, 0, plan.prompt, on_deltas)
        text = plan.fmt.decode(gen.token_ids).replace(plan.fmt.eos_text, "")
        calls = [chat_call(i["call_id"], i["name"], i["arguments"]) for i in out.items if i["type"] == "function_call"]
        said = re.sub(r"<tool_call>.*?</tool_call>", "", text, flags=re.DOTALL).strip() if calls else text
        extension = {"answer": extract_answer(text, default_extraction(plan.fmt.rules.name)), "stop_reason": finish,
                     "turns": [{"text": text, "finish_reason": gen.finish_reason, "tool_calls": []}],
                     "num_tool_calls": 0}
        return ResponseRun([{"role": "assistant", "content": said, "tool_calls": calls}], n_prompt, n_out,
                           "max_output_tokens" if finish == "length" else None, extension)

    # ------------------------------------------------------------------ the response object
    def body(self, plan: CheckedResponse, out: Output, status: str, result: ResponseRun | None = None,
             error: OpenAIError | None = None) -> dict[str, Any]:
        req = plan.req
        body: dict[str, Any] = {
            "id": plan.id, "object": "response", "created_at": plan.created, "status": status, "model":
            self.server.cfg.model_name, "output": copy.deepcopy(out.items), "error": None, "incomplete_details": None,
            "instructions": req.instructions, "max_output_tokens": req.max_output_tokens,
            "previous_response_id": req.previous_response_id,
            "temperature": self.server.temperature(plan.chat), "top_p": plan.chat.top_p, "tools": req.tools or [],
            "tool_choice": req.tool_choice or "auto",
            "parallel_tool_calls": req.parallel_tool_calls, "store": req.store, "metadata": req.metadata or {},
            "user": req.user, "text": {"format": {"type": "text"}}, "truncation": "disabled", "background": False,
            "reasoning": {"effort": None, "summary": None}, "usage": None}
        if result is not None:
            body["usage"] = usage(plan.fmt, out, result)
            body["rstar2"] = result.extension
            if result.incomplete:
                body["incomplete_details"] = {"reason": result.incomplete}
        if error is not None:
            body["error"] = {"code": "rate_limit_exceeded" if error.status == 429 else "server_error",
                             "message": error.message}
        return body

    def finished(self, plan: CheckedResponse, out: Output, result: ResponseRun) -> dict[str, Any]:
        """The final response object, stored when the request asks (store defaults to true)."""
        out.finish(result.incomplete is None)
        body = self.body(plan, out, "incomplete" if result.incomplete else "completed", result)
        if plan.req.store:
            self.store.put(Stored(stored_copy(body), plan.conversation + result.messages,
                                  plan.container_id if plan.stateful else None))
        plan.done = True
        return body

    # ------------------------------------------------------------------ streaming
    async def stream(self, plan: CheckedResponse) -> AsyncIterator[str]:
        """The Responses events: created, in_progress, each item's events as the loop makes them, then completed,
        incomplete or failed. A client that goes away cancels the generation and the sandbox work."""
        m = self.server.metrics
        current_request.set(plan.id)
        queue: asyncio.Queue[str] = asyncio.Queue()
        out = Output(lambda event: queue.put_nowait(f"event: {event['type']}\n{sse(event)}"))
        out.event("response.created", response=self.body(plan, out, "in_progress"))
        out.event("response.in_progress", response=self.body(plan, out, "in_progress"))
        m.in_flight.inc()
        t0, first = time.monotonic(), True
        task = asyncio.ensure_future(self.run(plan, out))
        getter: asyncio.Future | None = None
        try:
            while not task.done() or not queue.empty():
                getter = asyncio.ensure_future(queue.get())
                await asyncio.wait({getter, task}, return_when=asyncio.FIRST_COMPLETED)
                if not getter.done():
                    getter.cancel()
                    continue
                event = getter.result()
                if first and ".delta" in event.split("\n", 1)[0]:
                    m.ttft.observe(time.monotonic() - t0)
                    first = False
                yield event
            try:
                body, kind = self.finished(plan, out, task.result()), None
                kind = "response.incomplete" if body["status"] == "incomplete" else "response.completed"
            except Exception as e:  # noqa: BLE001 - the stream ends with response.failed whatever went wrong
                out.finish(False)
                body, kind = self.body(plan, out, "failed", error=failure(plan.id, e)), "response.failed"
            out.event(kind, response=body)
            while not queue.empty():
                yield queue.get_nowait()
        finally:
            if getter is not None:
                getter.cancel()
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
            m.in_flight.dec()


def stored_copy(body: dict[str, Any]) -> dict[str, Any]:
    """The response as the store keeps it: each program's output once, in its code_interpreter_call item's logs (the
    trajectory's calls keep their status and duration, not their stdout and stderr again)."""
    ext = body.get("rstar2")
    if not ext or not ext.get("num_tool_calls"):
        return body
    turns = [{**t, "tool_calls": [{k: v for k, v in c.items() if k not in ("stdout", "stderr")}
                                  for c in t["tool_calls"]]} for t in ext["turns"]]
    return {**body, "rstar2": {**ext, "turns": turns}}


def chat_request(req: ResponsesRequest, functions: list[dict[str, Any]]) -> ChatRequest:
    """The request as Server's helpers read a chat request (already checked here: built without validation)."""
    fields = {"tools": functions or None, "tool_choice": req.tool_choice, "temperature": req.temperature,
              "parallel_tool_calls": req.parallel_tool_calls, "top_p": req.top_p, "format": req.format,
              "max_tokens": req.max_output_tokens, "max_turns": req.max_turns, "tool_timeout": req.tool_timeout}
    return ChatRequest.model_construct(messages=[], **{k: v for k, v in fields.items() if v is not None})


def stateful_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """The format's Python tool, described as what a stateful container is (same name and arguments)."""
    fn = schema.get("function", schema)
    return {"type": "function", "function": {**fn, "description": STATEFUL_NOTE}}


def put_text(out: Output, deltas: list[Delta]) -> None:
    """The loop's reply deltas, less its calls: each is a code_interpreter_call item (the loop's tool_call event)."""
    for d in deltas:
        if d.kind in ("reasoning", "content"):
            out.text(d.kind, d.text)


def code_of(call: ToolCallRecord) -> str:
    code = call.arguments.get("code")
    return code if isinstance(code, str) else call.raw


def logs_of(call: ToolCallRecord) -> str:
    """What the program printed (stdout, then stderr); for a call that could not run, what the model was told."""
    return call.response if call.error is not None else call.stdout + call.stderr


def turn_messages(traj: Trajectory, eos: str) -> list[dict[str, Any]]:
    """The loop's turns as chat messages, for a continuation: each turn's text as generated with its calls as
    tool_calls, then the tool responses the model read."""
    out: list[dict[str, Any]] = []
    for turn in traj.turns:
        text = turn.text.replace(eos, "")
        ran = [c for c in turn.tool_calls if c.error is None and c.response]
        for c in ran:
            text = text.replace(c.raw, "", 1)
        out.append({"role": "assistant", "content": text.strip(),
                    "tool_calls": [chat_call(c.id, c.name, json.dumps(c.arguments, ensure_ascii=False)) for c in ran]})
        out += [{"role": "tool", "tool_call_id": c.id, "content": c.response} for c in turn.tool_calls if c.response]
    return out


def usage(fmt: ChatFormat, out: Output, result: ResponseRun) -> dict[str, Any]:
    reasoning = sum(len(fmt.encode(i["content"][0]["text"])) for i in out.items if i["type"] == "reasoning")
    return {"input_tokens": result.input_tokens, "output_tokens": result.output_tokens,
            "total_tokens": result.input_tokens + result.output_tokens,
            "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens_details": {"reasoning_tokens": min(reasoning, result.output_tokens)}}


def failure(response_id: str, e: Exception) -> OpenAIError:
    if isinstance(e, OpenAIError):
        return e
    if isinstance(e, EngineError):
        return engine_failure(e)
    log.error("response %s failed", response_id, exc_info=e)
    return OpenAIError(500, f"{response_id} failed: {type(e).__name__}: {e}", kind="server_error")


# ---------------------------------------------------------------------------------------------- routes
def add_responses_routes(app: FastAPI, server: Server) -> None:
    """The /v1/responses routes; their containers are swept while the app runs and closed when it stops."""
    responses = Responses(server)
    app.state.responses = responses  # its store and containers, for /health-like looks from outside
    inner = app.router.lifespan_context

    @contextlib.asynccontextmanager
    async def lifespan(a: FastAPI):
        async with inner(a) as state:
            sweeper = asyncio.create_task(responses.containers.sweep_forever())
            try:
                yield state
            finally:
                sweeper.cancel()
                await responses.containers.close_all()

    app.router.lifespan_context = lifespan

    @app.post("/v1/responses")
    async def create(req: ResponsesRequest, request: Request):
        plan = await responses.plan(req)
        current_request.set(plan.id)  # the tasks below inherit it: a stall names the request
        if req.stream:
            return Releasing(responses.stream(plan), lambda: responses.release(plan), media_type="text/event-stream")
        out = Output()
        try:
            with server.metrics.in_flight.track_inprogress():
                result = await until_done_or_gone(request, responses.run(plan, out))
            return responses.finished(plan, out, result)
        finally:
            responses.release(plan)

    @app.get("/v1/responses/{response_id}")
    async def retrieve(response_id: str) -> dict[str, Any]:
        return responses.store.get(response_id).body

    @app.delete("/v1/responses/{response_id}")
    async def delete(response_id: str) -> dict[str, Any]:
        responses.store.delete(response_id)
        return {"id": response_id, "object": "response.deleted", "deleted": True}


class Releasing(StreamingResponse):
    """A stream that calls `release` when it ends, however it ends (its generator's own `finally` does not run when
    the client goes away before the first chunk)."""

    def __init__(self, content: Any, release: Any, **kw: Any):
        super().__init__(content, **kw)
        self.release = release

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.release()
