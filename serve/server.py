"""The server object of `rstar2 serve` and what its routes share: the config, the engine, sandbox and budgets,
the rendering pool, the reply and trajectory shapes, and the wait that ends when the client leaves. The routes
are app.py's (chat and completions) and responses.py's (the Responses API), both built on this module."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from fastapi import Request

from rstar2_agent.agent import AgentConfig, StreamDecoder, run_agent
from rstar2_agent.chat_format import FORMATS, ChatFormat, HermesFormat
from rstar2_agent.engines.base import Engine, EngineError, SamplingParams
from rstar2_agent.repetition import RepetitionStop, generate_watched
from rstar2_agent.sandbox import Sandbox
from rstar2_agent.sandbox.types import ExecResult, Status
from rstar2_agent.trajectory import ToolCallRecord, Trajectory

from .guard import (
    Budgets,
    FairGate,
    current_client,
)
from .metrics import ServeMetrics
from .protocol import ChatRequest, OpenAIError
from .reply_stream import (
    Delta,
    Reply,
    ReplyParser,
    parse_reply,
    reply_of,
    starts_in_reasoning,
)
from .tool_constraints import tool_call_constraint
from .watchdog import EngineStalled, ProgressWatch

log = logging.getLogger(__name__)



@dataclass
class ServeConfig:
    model_name: str
    format: str = "hermes"  # the format; requests with client `tools` use hermes unless it is rstar2-release
    chat_template: str | None = None
    max_turns: int = 30  # the default and the most a request may ask for
    max_tokens: int = 8192  # default response budget when a request sets none
    temperature: float = 0.6  # the sampling temperature of a request that sets none (serve: the model's default)
    tool_timeout: float = 10.0  # a call's default wall-time limit
    max_tool_timeout: float = 60.0  # the most a request's tool_timeout may ask for
    max_concurrency: int = 64
    # slots of max_concurrency one client's tool loops hold at once (None: a quarter); plain generations (client
    # tools, completions) hold a slot only while the engine works on them and take any free one
    max_concurrency_per_client: int | None = None
    tool_seconds_per_client: float = 600.0  # sandbox wall seconds a client may spend a minute (0: no budget)
    api_key: str | None = None
    public_health: bool = False  # /health answers without the key (when there is one)
    public_metrics: bool = False  # /metrics answers without the key (when there is one)
    max_body_mb: float = 8.0  # a larger request body is refused with 413 while it is read
    header_timeout: float = 10.0  # seconds a connection has to send a request's headers
    body_timeout: float = 60.0  # seconds a request has to send its body, once its headers are in
    max_connections_per_client: int = 256  # connections open at once from one address
    forwarded_allow_ips: str | None = None  # proxies whose X-Forwarded-For names the client (None: none is trusted)
    stall_timeout: float | None = 300.0  # a request with no new token for this long is aborted (None: never)
    separate_reasoning: bool = True  # reasoning_content apart from content (a request's separate_reasoning wins)
    # tool_choice "required"/named: tokens of free text (reasoning) allowed before the forced call; 0, as vLLM: the
    # call comes first
    forced_call_text_tokens: int = 0
    max_stored_responses: int = 1000  # /v1/responses kept for previous_response_id and GET (least recently used out)
    max_stored_mb: float = 256.0  # and at most this many megabytes of them (their JSON)
    max_containers: int = 16  # /v1/responses code_interpreter containers open at once (a sandbox session each)
    container_idle_timeout: float = 1200.0  # seconds an unused container lives (OpenAI's containers: 20 minutes)
    # a generation that loops ends with the stop reason `repetition` (repetition.py), finish_reason "length" (None:
    # off, as vLLM's server by default)
    repetition: RepetitionStop | None = field(default_factory=RepetitionStop)


class Server:
    def __init__(self, engine: Engine, sandbox: Sandbox, config: ServeConfig):
        self.metrics = ServeMetrics()
        self.engine = ProgressWatch(engine, config.stall_timeout, on_stall=self.metrics.stalled.inc)
        self.sandbox, self.cfg = sandbox, config
        self.formats = {p: ChatFormat(engine.tokenizer, p, config.chat_template) for p in FORMATS}
        self.gate = asyncio.Semaphore(config.max_concurrency)
        per_client = config.max_concurrency_per_client or max(1, config.max_concurrency // 4)
        self.budgets = Budgets(per_client, config.tool_seconds_per_client)
        self.tool_gate = FairGate(self.sandbox_capacity)
        self.vocab_size = len(engine.tokenizer)  # len() of a tokenizer is not free: once
        # rendering and tokenizing a large request takes seconds of CPU: off the event loop, so that /health and
        # the other clients' streams are served meanwhile
        self.pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="rstar2-render")

    async def sandbox_capacity(self) -> int:
        """How many calls the sandbox runs at once: the local pool's workers per template (a call runs on one
        template's workers), a remote one's live workers."""
        workers = getattr(getattr(self.sandbox, "config", None), "workers", None)
        if isinstance(workers, int) and workers > 0:
            return workers
        try:
            stats = await self.sandbox.stats()
        except Exception:  # noqa: BLE001 - a sandbox that cannot say: a guess, the gate then only orders the calls
            return 4
        return int(stats.get("workers") or stats.get("alive") or 4)

    async def off_loop(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self.pool, fn, *args)

    async def render(self, fmt: ChatFormat, messages: list[dict[str, Any]], tools: Any, problem_prefix: bool = True
                     ) -> list[int]:
        return await self.off_loop(functools.partial(fmt.render_prompt, messages, tools, problem_prefix=problem_prefix))

    # ------------------------------------------------------------------ helpers
    def check_model(self, name: str | None) -> None:
        if name and name != self.cfg.model_name:
            raise OpenAIError(404, f"The model `{name}` does not exist; this server serves `{self.cfg.model_name}`.",
                              "model", "model_not_found")

    def check_fits(self, prompt_ids: list[int], budget: int | None, prompt_param: str, budget_param: str) -> None:
        """The prompt and the requested response budget both fit in the model's context."""
        n, context = len(prompt_ids), self.engine.context_length
        if n >= context:
            raise OpenAIError(400, f"The prompt has {n} tokens; this model's context is {context}. Shorten the "
                              f"{prompt_param}.", prompt_param, "context_length_exceeded")
        if budget is not None and n + budget > context:
            raise OpenAIError(400, f"{budget_param} is {budget}, but the prompt has {n} tokens and this model's "
                              f"context is {context}: ask for at most {context - n}.", budget_param,
                              "context_length_exceeded")

    def check_caps(self, req: Any) -> None:
        """A request's max_turns and tool_timeout within the server's caps (a 400 naming the cap, rather than 100
        turns of 600 s calls holding a slot for hours)."""
        if req.max_turns is not None and req.max_turns > self.cfg.max_turns:
            raise OpenAIError(400, f"max_turns is {req.max_turns}; this server allows at most {self.cfg.max_turns} "
                              "(rstar2 serve --max-turns).", "max_turns")
        if req.tool_timeout is not None and req.tool_timeout > self.cfg.max_tool_timeout:
            raise OpenAIError(400, f"tool_timeout is {req.tool_timeout:g} s; this server allows at most "
                              f"{self.cfg.max_tool_timeout:g} s (rstar2 serve --max-tool-timeout).", "tool_timeout")

    def check_token_ids(self, ids: list[int], param: str) -> None:
        bad = next((i for i, t in enumerate(ids) if not 0 <= t < self.vocab_size), None)
        if bad is not None:
            raise OpenAIError(400, f"{param}[{bad}] is {ids[bad]}; token ids must be integers in "
                              f"[0, {self.vocab_size})", f"{param}[{bad}]")

    def temperature(self, req: Any) -> float:
        """The request's temperature, else the server's default for its model (ServeConfig.temperature)."""
        return self.cfg.temperature if req.temperature is None else req.temperature

    def sampling(self, req: Any, index: int, budget: int | None, **extra: Any) -> SamplingParams:
        seed = None if req.seed is None else req.seed + index
        return SamplingParams(temperature=self.temperature(req), top_p=req.top_p, seed=seed,
                              max_tokens=budget or self.cfg.max_tokens, stop=req.stops(), **extra)

    def forced_call(self, req: ChatRequest) -> dict[str, Any] | None:
        """The decoding constraint of tool_choice "required" or named (None for "auto" and "none"): guided
        decoding, which only an engine that constrains its decoding (vllm in this process) does; any other refuses
        the request by name, and so does a tool whose schema cannot constrain decoding."""
        if not req.forces_call():
            return None
        if not self.engine.constrains:
            raise OpenAIError(400, f"tool_choice {json.dumps(req.tool_choice)} needs guided decoding, which the "
                              f"{self.engine.name} engine does not do: serve with --engine vllm, or send "
                              'tool_choice "auto" and ask for the call in the prompt', "tool_choice")
        try:
            return tool_call_constraint(req.tools, req.tool_choice, req.parallel_tool_calls,
                                        text_tokens=self.cfg.forced_call_text_tokens,
                                        max_calls=HermesFormat.max_calls_per_turn)
        except ValueError as e:
            raise OpenAIError(400, str(e), "tool_choice") from e

    def format_for(self, req: ChatRequest) -> ChatFormat:
        """The request's format, else the server's; client tools are rendered and parsed as Hermes calls
        (the markdown format has no way to declare them; the release's format is Hermes-shaped already)."""
        name = req.format or self.cfg.format
        return self.formats["hermes" if req.tools and name == "markdown" else name]

    # ------------------------------------------------------------------ chat: the server-side tool loop
    def agent_config(self, req: ChatRequest, index: int) -> AgentConfig:
        budget = req.budget() or self.cfg.max_tokens
        return AgentConfig(max_turns=req.max_turns or self.cfg.max_turns, max_response_tokens=budget,
                           tool_timeout=req.tool_timeout or self.cfg.tool_timeout,
                           max_calls_per_turn=None if req.parallel_tool_calls else 1, repetition=self.cfg.repetition,
                           sampling=self.sampling(req, index, budget))

    async def run_loop(self, req: ChatRequest, index: int, prompt: list[int], on_event=None,
                       sandbox: Sandbox | None = None, engine: Engine | None = None) -> Trajectory:
        """The agent loop for one choice; `sandbox`: where its code runs instead of the server's (a container);
        `engine`: the server's as this request sees it (a stream's token count)."""
        budgeted = Budgeted(sandbox or self.sandbox, self.budgets, self.tool_gate, current_client.get())
        # the loop holds its slot through its sandbox time too: one client holds at most its share of the slots
        async with self.budgets.slot(self.gate):
            traj = await run_agent(req.messages, engine or self.engine, budgeted, self.format_for(req),
                                   self.agent_config(req, index), prompt_ids=prompt, on_event=on_event)
        self.metrics.observe_trajectory(traj)
        if traj.stop_reason == "engine_error":
            failure = traj.failure
            raise engine_failure(failure if isinstance(failure, EngineError) else EngineError(traj.error))
        return traj

    def splits(self, req: ChatRequest) -> bool:
        return self.cfg.separate_reasoning if req.separate_reasoning is None else req.separate_reasoning

    def reply_parser(self, req: ChatRequest, prompt: list[int], tools: list[dict[str, Any]] | None = None,
                     loop: bool = False) -> ReplyParser:
        """The parser of this request's reply: the format's split (unless raw text is asked for), the client's
        tools (none with tool_choice "none"), and in the server's own loop its calls as part of the reasoning."""
        fmt = self.format_for(req)
        return ReplyParser(fmt.rules.name, starts_in_reasoning(fmt.decode(prompt[-16:])),
                           tools=None if req.tool_choice == "none" else tools, parallel=req.parallel_tool_calls,
                           calls_as_reasoning=loop, split=self.splits(req))

    def loop_message(self, traj: Trajectory, req: ChatRequest, prompt: list[int]) -> dict[str, Any]:
        eos = self.format_for(req).eos_text
        if not self.splits(req):  # the raw text the model generated, every turn (the tool responses are in rstar2)
            return {"role": "assistant", "content": traj.text.replace(eos, ""), "rstar2": trajectory_extension(traj)}
        reply = parse_reply([t.text.replace(eos, "") for t in traj.turns], self.reply_parser(req, prompt, loop=True))
        return {**reply_message(reply, True), "rstar2": trajectory_extension(traj)}

    # ------------------------------------------------------------------ chat: client-side tools
    async def run_client_tools(self, req: ChatRequest, index: int, prompt: list[int],
                               on_deltas: Callable[[list[Delta]], None] | None = None,
                               constraint: dict[str, Any] | None = None, engine: Engine | None = None):
        """One generation; its calls of the client's tools parsed as they are written. `on_deltas` hears each
        piece of content, reasoning and call as the tokens come (a stream); without it the text is parsed whole
        (the same parser: the two forms agree). `constraint`: a forced call's (`forced_call`, built once a request);
        `engine`: as for `run_loop`."""
        engine = engine or self.engine
        fmt = self.format_for(req)
        parser = self.reply_parser(req, prompt, tools=req.tools)
        deltas: list[Delta] = []

        def take(new: list[Delta]) -> None:
            deltas.extend(new)
            if new and on_deltas is not None:
                on_deltas(new)

        decoder = StreamDecoder(fmt, lambda kind, text: take(parser.feed(text.replace(fmt.eos_text, "")))) \
            if on_deltas is not None else None
        sampling = self.sampling(req, index, min(req.budget() or self.cfg.max_tokens,
                                                 engine.context_length - len(prompt)),
                                 stop_token_ids=fmt.stop_token_ids, constraint=constraint)
        async with self.gate:  # a generation holds its slot only while the engine works on it: no per-client share
            gen = await generate_watched(engine, prompt, sampling, decoder.feed if decoder else None,
                                         self.cfg.repetition)
        if decoder is not None:
            decoder.flush()
        else:
            take(parser.feed(fmt.decode(gen.token_ids).replace(fmt.eos_text, "")))
        take(parser.finish())
        self.metrics.tokens.labels("prompt").inc(len(prompt))
        self.metrics.tokens.labels("completion").inc(len(gen.token_ids))
        reply = reply_of(deltas)
        finish = "length" if gen.finish_reason in ("length", "repetition") else "tool_calls" if reply.calls else "stop"
        return reply_message(reply, self.splits(req)), finish, len(prompt), len(gen.token_ids), gen


class Budgeted(Sandbox):
    """The sandbox as one request's loop sees it: a call runs while its client has sandbox time left this minute,
    and is charged what it ran (past the budget it is refused, and the model reads why); it waits for a worker in
    the fair gate, where a client that filled the pool does not keep the others waiting behind all its calls."""

    def __init__(self, inner: Sandbox, budgets: Budgets, gate: FairGate, client: str):
        self.inner, self.budgets, self.gate, self.client = inner, budgets, gate, client

    async def run(self, code: str, stdin: str = "", timeout: float | None = None) -> ExecResult:
        if self.budgets.tool_time_left(self.client) <= 0:
            return ExecResult.failure(Status.QUEUE_TIMEOUT, "the call did not run: this client has spent its "
                                      f"sandbox time ({self.budgets.tool_seconds:g} s a minute); retry in "
                                      f"{self.budgets.retry_after(self.client)} s")
        async with self.gate.slot(self.client):
            t0 = time.monotonic()
            result = None
            try:
                result = await self.inner.run(code, stdin, timeout)
                return result
            finally:
                self.budgets.charge(result.duration if result is not None and result.duration else
                                    time.monotonic() - t0, self.client)

    async def open_session(self) -> str:
        return await self.inner.open_session()

    async def run_in_session(self, session_id: str, code: str, stdin: str = "",
                             timeout: float | None = None) -> ExecResult:
        return await self.inner.run_in_session(session_id, code, stdin, timeout)

    async def close_session(self, session_id: str) -> None:
        await self.inner.close_session(session_id)

    async def stats(self) -> dict[str, Any]:
        return await self.inner.stats()


def engine_failure(e: EngineError) -> OpenAIError:
    """What the client is told: a stall is a 504 naming the request; any other engine failure a 500."""
    if isinstance(e, EngineStalled):
        return OpenAIError(504, str(e), code="engine_stalled", kind="server_error")
    return OpenAIError(500, f"the engine failed: {e}", kind="server_error")


def reply_message(reply: Reply, split: bool) -> dict[str, Any]:
    """The assistant message of a reply: content (null beside calls when there is none), reasoning_content where
    reasoning is split out, and the calls as OpenAI's tool_calls."""
    msg: dict[str, Any] = {"role": "assistant", "content": reply.content if reply.calls else reply.content or ""}
    if split:
        msg["reasoning_content"] = reply.reasoning
    if reply.calls:
        msg["tool_calls"] = [{"id": c["id"], "type": "function",
                              "function": {"name": c["name"], "arguments": c["arguments"]}} for c in reply.calls]
    return msg


def delta_of(d: Delta) -> dict[str, Any]:
    """A reply's delta as a chat.completion.chunk's delta: each call's index, id and name once, then its argument
    fragments."""
    if d.kind == "content":
        return {"content": d.text}
    if d.kind == "reasoning":
        return {"reasoning_content": d.text}
    if d.kind == "call":
        return {"tool_calls": [{"index": d.index, "id": d.id, "type": "function",
                                "function": {"name": d.name, "arguments": ""}}]}
    return {"tool_calls": [{"index": d.index, "function": {"arguments": d.text}}]}


def trajectory_extension(traj: Trajectory) -> dict[str, Any]:
    """The `rstar2` field of an assistant message: the answer, why it stopped, and each turn with its calls."""
    return {
        "answer": traj.answer,
        "stop_reason": traj.stop_reason,
        "turns": [{"text": t.text, "finish_reason": t.finish_reason,
                   "tool_calls": [tool_call_dict(c) for c in t.tool_calls]} for t in traj.turns],
        "num_tool_calls": len(traj.tool_calls),
        "timings": traj.timings,
    }


def tool_call_dict(c: ToolCallRecord) -> dict[str, Any]:
    return {"id": c.id, "name": c.name, "arguments": c.arguments, "error": c.error, "status": c.status,
            "stdout": c.stdout, "stderr": c.stderr, "duration": c.duration}


def finish_of(traj: Trajectory) -> str:
    """A choice's finish_reason: "length" where the loop was cut short (a budget, the turn cap, a repetition stop:
    OpenAI has no finish reason for a loop, and vLLM's own "repetition" is not one clients know; `rstar2.stop_reason`
    says which), else "stop"."""
    return "length" if traj.stop_reason in ("max_tokens", "max_turns", "repetition") else "stop"


def sse(obj: Any) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


async def until_done_or_gone(request: Request, work: Awaitable[Any]) -> Any:
    """Await `work`, cancelling it (generation and sandbox calls) if the client disconnects first."""
    task = asyncio.ensure_future(work)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=0.25)
            if done:
                return task.result()
            if await request.is_disconnected():
                task.cancel()
                raise OpenAIError(499, "the client closed the request", code="client_closed_request")
    finally:
        if not task.done():
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
