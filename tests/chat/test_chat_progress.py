"""`rstar2 chat`'s live progress and defaults: a transient status line (tokens, tokens/s, elapsed) on a terminal,
nothing of it in output piped to a file; the repetition stop on in chat, off in the loop's own default (eval, RL);
a budget sized for the model."""

from __future__ import annotations

import io

from rich.console import Console

from rstar2_agent.agent import AgentConfig
from rstar2_agent.chat.conversation import ChatOptions
from rstar2_agent.chat.terminal import Renderer
from rstar2_agent.models import chat_defaults, default_temperature
from rstar2_agent.repetition import RepetitionStop
from rstar2_agent.trajectory import Trajectory, Turn


def play(renderer: Renderer) -> None:
    renderer("text", "Let me think")
    renderer("tokens", 3)
    if renderer.live is not None:
        renderer.live.refresh()
    renderer("text", " about it.\n")
    renderer("tokens", 4)
    renderer("turn_end", Turn(text="", num_tokens=7, finish_reason="stop"))


def test_a_terminal_shows_the_progress_line_while_the_answer_generates():
    buf = io.StringIO()
    renderer = Renderer(Console(file=buf, force_terminal=True, width=120), budget=1024)
    play(renderer)
    assert renderer.progress.tokens == 7
    assert renderer.progress.line().plain.startswith("generating: 7 tokens of 1024, ")
    renderer.end()
    out = buf.getvalue()
    assert "generating: 3 tokens of 1024" in out and "tokens/s" in out  # shown while it generated
    assert "Let me think about it." in out and renderer.live is None


def test_output_piped_to_a_file_holds_the_text_alone():
    buf = io.StringIO()  # not a terminal; pytest's stderr is not one either: no status line anywhere
    renderer = Renderer(Console(file=buf, width=120), budget=1024)
    play(renderer)
    traj = Trajectory(prompt_ids=[1], stop_reason="repetition", turns=[Turn("x", 1, "repetition")])
    renderer.final(traj)
    out = buf.getvalue()
    assert out.startswith("Let me think about it.\n") and "tokens/s" not in out and "generating" not in out
    assert "the answer was looping" in out and "--repetition-stop" in out


def test_chat_stops_loops_by_default_and_eval_and_rl_do_not():
    assert ChatOptions().repetition == RepetitionStop()
    assert AgentConfig().repetition is None  # the loop's default: eval and RL measure the model as it is
    assert chat_defaults("smollm2-135m") == (1024, 0.6) and chat_defaults("rstar2-agent-14b") == (4096, 0.6)
    assert chat_defaults("smollm2-agent") == (1024, 0.0)  # the made agent decodes greedily
    assert chat_defaults("/some/folder") == (4096, 0.6)
    assert default_temperature("smollm2-agent") == 0.0 and default_temperature(None) == 0.6  # serve's, the same
