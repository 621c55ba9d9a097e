"""`rstar2 chat`: a terminal chat with the agent, rendered with rich.

Reasoning streams as it is generated, each tool call shows as highlighted code and its output in a panel,
and the final answer stands apart. Ctrl-C stops the current answer, not the program, and drops that question;
/reset forgets the conversation, /exit leaves. `-p QUESTION` answers once and exits (`--json` prints the
trajectory).

The conversation is kept as the model saw it, token for token (DESIGN: token-in/token-out): the next question's
prompt is the previous answer's prompt ids and response ids (its generated ids and the inserted tool-response ids,
so earlier tool calls and results stay), then the end of the assistant turn where the model did not write it, the
new user turn and the generation prompt, as the format's template renders them after an assistant turn
(`next_question_ids`). The earlier conversation is never re-rendered or re-tokenized. `Conversation.ask` is one
question's step, the same for the terminal loop and `-p`.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import threading
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console
from rich.panel import Panel
from rich.syntax import Syntax
from rich.text import Text

from .agent import AgentConfig, run_agent
from .chat_format import ChatFormat
from .engines import Engine
from .engines.base import SamplingParams
from .engines.spec import EngineSpec
from .engines.spec import build as build_engine
from .sandbox import Sandbox
from .trajectory import ToolCallRecord, Trajectory


@dataclass
class ChatOptions(EngineSpec):
    temperature: float = 0.6
    max_turns: int = 10


def build(opts: ChatOptions, console: Console) -> tuple[Engine, ChatFormat]:
    with console.status("") as status:
        return build_engine(opts, status.update)


class Renderer:
    """Turns agent events into terminal output."""

    def __init__(self, console: Console, hide: tuple[str, ...] = ()):
        self.console, self.hide = console, hide

    def __call__(self, kind: str, payload: Any) -> None:
        if kind == "text":
            for token in self.hide:
                payload = payload.replace(token, "")
            self.console.print(Text(payload, style="dim"), end="")
        elif kind == "tool_call":
            self._call(payload)
        elif kind == "tool_result":
            self._result(payload)
        elif kind == "turn_end":
            self.console.print()

    def _call(self, call: ToolCallRecord) -> None:
        self.console.print()
        if call.error is not None:
            self.console.print(Panel(Text(call.raw or "(empty)"), title="malformed tool call", border_style="red"))
            return
        code = call.arguments.get("code", json.dumps(call.arguments, indent=2))
        self.console.print(Panel(Syntax(code, "python", theme="ansi_dark"), title=f"tool call: {call.name}",
                                 border_style="cyan"))

    def _result(self, call: ToolCallRecord) -> None:
        if call.error is not None:
            body, style, title = call.error, "red", "not run"
        else:
            body = (call.stdout + (("\n" if call.stdout else "") + call.stderr if call.stderr else "")).rstrip()
            style = "green" if call.status == "ok" else "yellow"
            title = f"{call.status} in {call.duration * 1000:.0f} ms"
        self.console.print(Panel(Text(body or "(no output)"), title=title, border_style=style))

    def final(self, traj: Trajectory) -> None:
        if traj.stop_reason == "engine_error":
            self.console.print(Panel(Text(traj.error or "engine error"), title="engine error", border_style="red"))
        if traj.answer is not None:
            self.console.print(Panel(Text(traj.answer, style="bold"), title="answer", border_style="magenta"))
        self.console.print(Text(f"[{traj.stop_reason}, {len(traj.turns)} turns, {len(traj.tool_calls)} tool calls, "
                                f"{traj.num_generated_tokens} tokens, {traj.timings['total']:.1f} s]", style="dim"))


async def answer(engine: Engine, sandbox: Sandbox, fmt: ChatFormat, prompt_ids: list[int], opts: ChatOptions,
                 renderer: Renderer | None) -> Trajectory:
    """One answer to a prompt already rendered (`prompt_ids`), with the chat's sampling and budgets."""
    cfg = AgentConfig(max_turns=opts.max_turns, max_response_tokens=opts.max_tokens,
                      sampling=SamplingParams(temperature=opts.temperature, max_tokens=opts.max_tokens))
    return await run_agent("", engine, sandbox, fmt, cfg, on_event=renderer, prompt_ids=prompt_ids)


def user_message(fmt: ChatFormat, text: str) -> dict[str, str]:
    return {"role": "user", "content": fmt.user_content(text)}


class ConversationError(Exception):
    """The conversation cannot take the next question; the message says what to do."""


def next_question_ids(fmt: ChatFormat, text: str, turn_ended_with_eos: bool) -> list[int]:
    """The ids that continue the conversation with the question `text` (ChatFormat.user_turn_ids), or what to do
    where the template cannot continue it token-exactly."""
    try:
        return fmt.user_turn_ids(text, turn_ended_with_eos)
    except ValueError as e:
        raise ConversationError(f"{e}; the conversation cannot be continued token-exactly: /reset after each answer, "
                                "or use --format hermes") from e


@dataclass
class Conversation:
    """The chat so far, as the model saw it: `ids` are the last answer's prompt ids and response ids, so every
    earlier question, turn, tool call and tool result, token for token ([] before the first question)."""

    engine: Engine
    sandbox: Sandbox
    fmt: ChatFormat
    opts: ChatOptions
    renderer: Renderer | None = None
    ids: list[int] = field(default_factory=list)

    def prompt_ids(self, text: str) -> list[int]:
        """The prompt for the question `text`: the conversation so far continued by a user turn, or, first, the
        format's prompt for the question alone."""
        if not self.ids:
            return self.fmt.render_prompt([user_message(self.fmt, text)])
        return self.ids + next_question_ids(self.fmt, text, self.ids[-1] == self.fmt.eos_id)

    async def ask(self, text: str) -> Trajectory:
        """Answer `text` in the conversation and keep the answer in it. An answer the engine failed, or one that
        is cancelled (Ctrl-C), leaves the conversation as it was before the question."""
        if not self.ids:  # a remote engine learns its context length from its server first
            await self.engine.probe()
        prompt = self.prompt_ids(text)
        context = self.engine.context_length
        if len(prompt) >= context:
            if self.ids:
                raise ConversationError(f"the conversation has {len(prompt)} tokens of the model's {context}: "
                                        "/reset to start over")
            raise ConversationError(f"the question has {len(prompt)} tokens, more than the model's context of "
                                    f"{context}: ask a shorter one")
        traj = await answer(self.engine, self.sandbox, self.fmt, prompt, self.opts, self.renderer)
        if traj.stop_reason != "engine_error":
            self.ids = traj.prompt_ids + traj.response_ids
        return traj

    def reset(self) -> None:
        """Forget the conversation: the next question starts a new one."""
        self.ids = []


async def chat_once(question: str, opts: ChatOptions, sandbox: Sandbox, as_json: bool, console: Console) -> int:
    engine, fmt = build(opts, console)
    try:
        async with sandbox:
            renderer = None if as_json else Renderer(console, (fmt.eos_text,))
            traj = await Conversation(engine, sandbox, fmt, opts, renderer).ask(question)
    except ConversationError as e:
        console.print(Text(str(e), style="red"))
        return 1
    finally:
        await engine.close()
    if as_json:
        sys.stdout.write(json.dumps(traj.to_dict()) + "\n")
    else:
        renderer.final(traj)
    return 0 if traj.stop_reason != "engine_error" else 1


def _read_line(console: Console, loop: asyncio.AbstractEventLoop) -> asyncio.Future:
    """Read one line in a daemon thread (a blocked read must not keep the program alive at exit)."""
    fut = loop.create_future()

    def work() -> None:
        try:
            line = console.input("[bold cyan]you> [/]")
        except BaseException:  # noqa: BLE001 - EOF or a closed terminal ends the chat
            loop.call_soon_threadsafe(lambda: fut.done() or fut.set_exception(EOFError()))
            return
        loop.call_soon_threadsafe(lambda: fut.done() or fut.set_result(line))

    threading.Thread(target=work, daemon=True).start()
    return fut


async def chat_loop(opts: ChatOptions, sandbox: Sandbox, console: Console) -> None:
    engine, fmt = build(opts, console)
    renderer = Renderer(console, (fmt.eos_text,))
    conversation = Conversation(engine, sandbox, fmt, opts, renderer)
    loop = asyncio.get_running_loop()
    current: dict[str, asyncio.Future | None] = {"answer": None, "input": None}

    def on_sigint() -> None:  # Ctrl-C: stop the answer being written; at the prompt, leave
        for key in ("answer", "input"):
            fut = current[key]
            if fut is not None and not fut.done():
                fut.cancel()
                return

    loop.add_signal_handler(signal.SIGINT, on_sigint)
    console.print(Text("Ask a question. /reset forgets the conversation, /exit leaves, Ctrl-C stops an answer.",
                       style="dim"))
    try:
        async with sandbox:
            while True:
                current["input"] = _read_line(console, loop)
                try:
                    line = (await current["input"]).strip()
                except (EOFError, asyncio.CancelledError):
                    break
                if not line:
                    continue
                if line == "/exit":
                    break
                if line == "/reset":
                    conversation.reset()
                    console.print(Text("(conversation forgotten)", style="dim"))
                    continue
                task = asyncio.ensure_future(conversation.ask(line))
                current["answer"] = task
                try:
                    traj = await task
                except asyncio.CancelledError:
                    console.print(Text("\n(stopped)", style="yellow"))
                    continue
                except ConversationError as e:
                    console.print(Text(str(e), style="yellow"))
                    continue
                finally:
                    current["answer"] = None
                renderer.final(traj)
    finally:
        loop.remove_signal_handler(signal.SIGINT)
        await engine.close()
