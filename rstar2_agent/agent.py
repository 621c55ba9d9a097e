"""The multi-turn agent loop: generate, parse tool calls, run them in the sandbox, insert the results, repeat.

Token-in/token-out: the response is the exact ids the engine generated plus the exact ids of the inserted
tool responses (mask 0); the conversation is never re-tokenized. Serve, eval and train all call
`run_agent`; many loops run at once on one engine and one sandbox. It never raises for a bad model
output, a failing tool or a failing engine: those end up in the trajectory.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from .chat_format import (
    FORMAT_RULES,
    ChatFormat,
    ToolCall,
    answer_blocks,
    answer_scope,
    default_extraction,
    extract_answer,
    format_result,
)
from .engines.base import Engine, EngineError, SamplingParams, call_seed
from .engines.trajectory_scope import one_trajectory
from .repetition import RepetitionStop, generate_watched
from .sandbox import release_tool
from .sandbox.release_tool import RELEASE_TOOL
from .sandbox.tools import STATELESS_TOOL
from .sandbox.types import ExecResult, Sandbox, Status
from .trajectory import ToolCallRecord, Trajectory, Turn


@dataclass
class AgentConfig:
    max_turns: int = 30  # assistant turns (paper: 10 in RL stages 1-2, 15 in stage 3, 30 at eval)
    max_response_tokens: int = 30000  # generated plus inserted tokens
    max_tool_output_chars: int | None = None  # as the model sees it; None: the format's (2048 a stream; release: 256)
    max_calls_per_turn: int | None = None  # None: the format's (hermes 8; markdown and the release 1)
    tool_timeout: float = 10.0
    sampling: SamplingParams = field(default_factory=SamplingParams)
    # end a turn that loops with the stop reason `repetition` (repetition.py); None: off (eval and RL measure the
    # model as it is), chat and serve turn it on
    repetition: RepetitionStop | None = None


# A stop string that may end a generation without a call (a markdown fence that closes no python block)
# resumes the turn; past this many resumes in one turn such soft stops are dropped for the rest of it.
MAX_RESUMES = 16

# Runs a tool call instead of the sandbox (benchmarks whose tools are not Python, e.g. BFCL's APIs):
# (name, arguments) -> the text the model is shown.
Execute = Callable[[str, dict[str, Any]], Awaitable[str]]

# Events for live display (rstar2 chat, streaming serve): ("text", str), ("tokens", int: how many were generated
# just now), ("tool_call", ToolCallRecord), ("tool_result", ToolCallRecord), ("turn_end", Turn).
OnEvent = Callable[[str, Any], None]


@one_trajectory  # its engine requests form one trajectory: a replica pool keeps them on one replica
async def run_agent(prompt: str | list[dict[str, Any]], engine: Engine, sandbox: Sandbox, fmt: ChatFormat,
                    config: AgentConfig | None = None, *, tools: list[dict[str, Any]] | None = None,
                    on_event: OnEvent | None = None,
                    prompt_ids: list[int] | None = None, execute: Execute | None = None) -> Trajectory:
    """Run the agent on a problem (wrapped in the rStar2 user prompt) or on OpenAI-style messages.
    `prompt_ids`: the prompt already rendered by `fmt` (a server that checked its length passes it).
    `execute`: runs every valid call instead of the sandbox."""
    cfg = config or AgentConfig()
    t_start = time.monotonic()
    traj = Trajectory(prompt_ids=list(prompt_ids) if prompt_ids is not None else fmt.render_prompt(prompt, tools))
    emit = on_event or (lambda kind, payload: None)
    stops = list(dict.fromkeys([*cfg.sampling.stop, *fmt.rules.stop]))
    calls_made = 0  # generations so far: each gets its own seed (call_seed)
    for turn_index in range(cfg.max_turns):
        room = min(cfg.max_response_tokens - len(traj.response_ids),
                   engine.context_length - len(traj.prompt_ids) - len(traj.response_ids))
        if room <= 0:
            traj.stop_reason = "max_tokens"
            break
        t0 = time.monotonic()
        decoder = StreamDecoder(fmt, emit, counts=True) if on_event else None
        turn_ids: list[int] = []
        turn_logprobs: list[float] = []
        resumes = 0
        try:
            while True:  # one assistant turn; resumed when a stop string ended it without a call
                turn_stops = stops if resumes < MAX_RESUMES else [s for s in stops if s not in fmt.rules.soft_stop]
                sampling = dataclasses.replace(cfg.sampling, max_tokens=min(cfg.sampling.max_tokens, room - len(
                    turn_ids)), stop=turn_stops, stop_token_ids=[*cfg.sampling.stop_token_ids, *fmt.stop_token_ids],
                    seed=call_seed(cfg.sampling.seed, calls_made))
                calls_made += 1
                gen = await generate_watched(engine, traj.prompt_ids + traj.response_ids + turn_ids, sampling,
                                             decoder.feed if decoder else None, cfg.repetition, turn_ids)
                turn_ids += gen.token_ids
                turn_logprobs += gen.logprobs
                text = fmt.decode(turn_ids)
                calls = fmt.parse(text, cfg.max_calls_per_turn or fmt.rules.max_calls_per_turn, tools)
                if calls or gen.stop_text is None or gen.finish_reason != "stop" or len(turn_ids) >= room:
                    break
                resumes += 1
        except (EngineError, OSError, RuntimeError, ValueError) as e:
            traj.fail(e)
            traj.add_generated(turn_ids, turn_logprobs)
            if turn_ids:
                traj.turns.append(Turn(text=fmt.decode(turn_ids), num_tokens=len(turn_ids), finish_reason="error"))
            break
        finally:
            traj.timings["generate"] += time.monotonic() - t0
            if decoder is not None:
                decoder.flush()
        turn = Turn(text=text, num_tokens=len(turn_ids), finish_reason=gen.finish_reason)
        traj.turns.append(turn)
        traj.add_generated(turn_ids, turn_logprobs)
        traj.stop_reason = stop_after_turn(text, bool(calls), gen.finish_reason == "length")
        if gen.finish_reason == "repetition":  # its calls, if any, are recorded, not run (as at the turn cap)
            turn.tool_calls = [not_run(c, turn_index) for c in calls]
            traj.stop_reason = "repetition"
        elif not traj.stop_reason and turn_index == cfg.max_turns - 1:
            # the turn cap: the last turn's calls are recorded, not run (as the release's loop stops before them)
            turn.tool_calls = [not_run(c, turn_index) for c in calls]
            traj.stop_reason = "max_turns"
        if traj.stop_reason:
            emit("turn_end", turn)
            break
        t0 = time.monotonic()
        turn.tool_calls = await run_calls(calls, turn_index, sandbox, cfg, fmt.rules.name, emit, execute)
        traj.timings["tools"] += time.monotonic() - t0
        ended_with_eos = bool(turn_ids) and turn_ids[-1] == fmt.eos_id
        inserted = fmt.tool_response_ids([c.response for c in turn.tool_calls], ended_with_eos, text)
        emit("turn_end", turn)
        if len(traj.response_ids) + len(inserted) >= cfg.max_response_tokens:
            traj.stop_reason = "max_tokens"
            break
        turn.inserted_tokens = len(inserted)
        traj.add_inserted(inserted)
    else:
        traj.stop_reason = "max_turns"
    mode = default_extraction(fmt.rules.name)
    traj.answer = extract_answer(answer_scope(traj, mode), mode)
    traj.timings["total"] = time.monotonic() - t_start
    return traj


def stop_after_turn(text: str, has_calls: bool, cut_off: bool) -> str:
    """Why the loop ends after a turn, or "" to run its calls and go on (the rule of every loop: the token-level
    one here and eval's chat-API one). A turn cut off by a length limit (the response budget, the engine's context,
    a per-turn cap) ends the loop as `max_tokens` whatever it holds: the rollout is truncated (RL rewards it 0, as
    the paper does overlong rollouts). Otherwise a turn without a call ends it as `answer` when it wrote an
    <answer> block, else `no_tool_call`."""
    if cut_off:
        return "max_tokens"
    if not has_calls:
        return "answer" if answer_blocks(text) else "no_tool_call"
    return ""


def record(call: ToolCall, turn: int) -> ToolCallRecord:
    """A parsed call as the trajectory keeps it, before it runs."""
    return ToolCallRecord(turn=turn, id=call.id, name=call.name, arguments=call.arguments, raw=call.raw,
                          error=call.error)


def not_run(call: ToolCall, turn: int) -> ToolCallRecord:
    """A call the loop records without running it (the turn cap ended the trajectory)."""
    rec = record(call, turn)
    rec.status = None if call.error else "not_run"
    return rec


async def run_calls(calls: list[ToolCall], turn: int, sandbox: Sandbox | None, cfg: AgentConfig, format_name: str,
                    emit: OnEvent | None = None, execute: Execute | None = None) -> list[ToolCallRecord]:
    """Run a turn's calls concurrently; a call that cannot run, or whose sandbox fails, still gets an answer."""
    emit = emit or (lambda kind, payload: None)

    async def one(call: ToolCall) -> ToolCallRecord:
        rec = record(call, turn)
        emit("tool_call", rec)
        result: ExecResult | None = None
        if call.error is None and execute is not None:
            try:
                rec.response, rec.status = await execute(call.name, call.arguments), "ok"
            except Exception as e:  # noqa: BLE001 - the model is told, as a tool would tell it
                rec.response, rec.status = f"Error during execution: {type(e).__name__}: {e}", "error"
            emit("tool_result", rec)
            return rec
        if call.error is None:
            result = await _execute(call, sandbox, cfg.tool_timeout)
            rec.status, rec.stdout, rec.stderr, rec.duration = str(result.status), result.stdout, result.stderr, \
                result.duration
        limit = cfg.max_tool_output_chars or FORMAT_RULES[format_name].max_tool_output_chars
        rec.response = format_result(call, result, limit, format_name)
        emit("tool_result", rec)
        return rec

    return list(await asyncio.gather(*(one(c) for c in calls)))


async def _execute(call: ToolCall, sandbox: Sandbox, timeout: float) -> ExecResult:
    args = call.arguments
    try:
        if call.name == STATELESS_TOOL:
            return await sandbox.run(args.get("code", ""), stdin=args.get("input", "") or "", timeout=timeout)
        if call.name == RELEASE_TOOL:  # the release's executor around the code (rstar2-release)
            return await sandbox.run(release_tool.program(args["code"]), stdin=args["input"], timeout=timeout)
        return ExecResult.failure(Status.INTERNAL_ERROR, f"no executor for the tool {call.name!r}")
    except Exception as e:  # noqa: BLE001 - a sandbox that is down still gives the model an answer
        return ExecResult.failure(Status.INTERNAL_ERROR, f"the sandbox failed: {type(e).__name__}: {e}")


class StreamDecoder:
    """Turns streamed token ids into text deltas, incrementally (as vLLM's detokenizer does): decode a short
    window and emit what it adds, waiting while a multi-byte character is incomplete."""

    def __init__(self, fmt: ChatFormat, emit: OnEvent, counts: bool = False):
        self.fmt, self.emit, self.counts = fmt, emit, counts  # counts: emit ("tokens", n) as well
        self.ids: list[int] = []
        self.prefix = self.read = 0

    def feed(self, new_ids: list[int], logprobs: list[float] | None = None) -> None:
        if self.counts:
            self.emit("tokens", len(new_ids))
        self.ids += new_ids
        before = self.fmt.decode(self.ids[self.prefix:self.read])
        after = self.fmt.decode(self.ids[self.prefix:])
        if len(after) > len(before) and not after.endswith("\ufffd"):
            self.emit("text", after[len(before):])
            self.prefix, self.read = self.read, len(self.ids)

    def flush(self) -> None:
        """At the end of a turn: emit what was held back (text that really ends in an invalid character)."""
        before = self.fmt.decode(self.ids[self.prefix:self.read])
        after = self.fmt.decode(self.ids[self.prefix:])
        if len(after) > len(before):
            self.emit("text", after[len(before):])
        self.prefix = self.read = len(self.ids)
