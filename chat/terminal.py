"""`rstar2 chat`: a terminal chat with the agent, rendered with rich.

Reasoning streams as it is generated, each tool call shows as highlighted code and its output in a panel,
and the final answer stands apart. Ctrl-C stops the current answer, not the program, and drops that question;
/reset forgets the conversation, /exit leaves. `-p QUESTION` answers once and exits (`--json` prints the
trajectory). The conversation itself is conversation.py's.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import threading
from typing import Any

from rich.console import Console
from rich.panel import Panel
from rich.syntax import Syntax
from rich.text import Text

from rstar2_agent.chat_format import ChatFormat
from rstar2_agent.engines import Engine
from rstar2_agent.engines.spec import build as build_engine
from rstar2_agent.sandbox import Sandbox
from rstar2_agent.trajectory import ToolCallRecord, Trajectory

from .conversation import ChatOptions, Conversation, ConversationError


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
