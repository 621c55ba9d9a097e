"""`rstar2 chat`: a terminal chat with the agent, rendered with rich.

Reasoning streams as it is generated, each tool call shows as highlighted code and its output in a panel,
and the final answer stands apart. While an answer generates, a transient status line says how many tokens, how
fast and for how long (on a terminal only: stdout piped to a file gets the text alone, and the status line goes to
stderr when that is a terminal). Ctrl-C stops the current answer, not the program, and drops that question;
/reset forgets the conversation, /exit leaves. `-p QUESTION` answers once and exits (`--json` prints the
trajectory). The conversation itself is conversation.py's.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import threading
import time
from typing import Any

from rich.console import Console, Group
from rich.live import Live
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


class Progress:
    """The status line of an answer being generated: tokens, tokens/s, elapsed (rendered afresh at each refresh)."""

    def __init__(self, budget: int | None = None):
        self.budget, self.tokens, self.start = budget, 0, time.monotonic()
        self.text = ""  # the turn being written, where the live region shows its tail

    def line(self) -> Text:
        elapsed = time.monotonic() - self.start
        rate = self.tokens / elapsed if elapsed > 0 else 0.0
        of = f" of {self.budget}" if self.budget else ""
        return Text(f"generating: {self.tokens} tokens{of}, {rate:.1f} tokens/s, {elapsed:.0f} s (Ctrl-C stops)",
                    style="cyan")

    def __rich__(self) -> Group:
        lines = self.text.splitlines()[-8:]
        return Group(Text("\n".join(lines), style="dim"), self.line()) if lines else Group(self.line())


class Renderer:
    """Turns agent events into terminal output. On a terminal the turn being written shows in a transient live
    region above a progress line (Progress) and is printed for good when the turn ends; elsewhere (stdout piped) the
    text is written as it comes, and the progress line goes to stderr if that is a terminal. `quiet`: the progress
    line alone (`-p --json`: stdout holds only the JSON)."""

    def __init__(self, console: Console, hide: tuple[str, ...] = (), budget: int | None = None, quiet: bool = False):
        self.console, self.hide, self.budget, self.quiet = console, hide, budget, quiet
        self.progress: Progress | None = None
        self.live: Live | None = None
        self.inline = console.is_terminal and not quiet  # the text goes through the live region

    def _start(self) -> None:
        if self.progress is not None:
            return
        self.progress = Progress(self.budget)
        status = self.console if self.console.is_terminal else Console(stderr=True)
        if status.is_terminal and not status.is_dumb_terminal:
            self.live = Live(self.progress, console=status, transient=True, refresh_per_second=4)
            self.live.start()

    def _flush(self) -> None:
        """Print the turn written so far for good (above the live region)."""
        if self.progress is not None and self.progress.text:
            text, self.progress.text = self.progress.text, ""
            if self.inline:  # whole lines: a line left open would run into the live region
                self.console.print(Text(text.rstrip("\n"), style="dim"))

    def end(self) -> None:
        """The answer is over (done, failed or stopped): the live region goes, what was written stays."""
        self._flush()
        if self.live is not None:
            self.live.stop()
        self.live = self.progress = None

    def __call__(self, kind: str, payload: Any) -> None:
        self._start()
        if kind == "tokens":
            self.progress.tokens += payload
        elif self.quiet:
            return
        elif kind == "text":
            for token in self.hide:
                payload = payload.replace(token, "")
            if self.inline:
                self.progress.text += payload
            else:
                self.console.print(Text(payload, style="dim"), end="")
        elif kind == "tool_call":
            self._flush()
            self._call(payload)
        elif kind == "tool_result":
            self._result(payload)
        elif kind == "turn_end":
            if self.inline and self.progress.text:
                self._flush()
            else:
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
        self.end()
        if traj.stop_reason == "repetition":
            self.console.print(Text("(the answer was looping: stopped; --repetition-stop tunes or turns off this stop)",
                                    style="yellow"))
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
            renderer = Renderer(console, (fmt.eos_text,), opts.max_tokens, quiet=as_json)
            try:
                traj = await Conversation(engine, sandbox, fmt, opts, renderer).ask(question)
            finally:
                renderer.end()
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
    renderer = Renderer(console, (fmt.eos_text,), opts.max_tokens)
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
                    renderer.end()
                    console.print(Text("\n(stopped)", style="yellow"))
                    continue
                except ConversationError as e:
                    renderer.end()
                    console.print(Text(str(e), style="yellow"))
                    continue
                finally:
                    current["answer"] = None
                    renderer.end()
                renderer.final(traj)
    finally:
        loop.remove_signal_handler(signal.SIGINT)
        await engine.close()
