"""The chat as the model saw it, token for token (DESIGN: token-in/token-out): the next question's prompt is the
previous answer's prompt ids and response ids (its generated ids and the inserted tool-response ids, so earlier tool
calls and results stay), then the end of the assistant turn where the model did not write it, the new user turn and
the generation prompt, as the format's template renders them after an assistant turn (`next_question_ids`). The
earlier conversation is never re-rendered or re-tokenized. `Conversation.ask` is one question's step, the same for
the terminal loop and `-p`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rstar2_agent.agent import AgentConfig, OnEvent, run_agent
from rstar2_agent.chat_format import ChatFormat
from rstar2_agent.engines import Engine
from rstar2_agent.engines.base import SamplingParams
from rstar2_agent.engines.spec import EngineSpec
from rstar2_agent.repetition import RepetitionStop
from rstar2_agent.sandbox import Sandbox
from rstar2_agent.trajectory import Trajectory


@dataclass
class ChatOptions(EngineSpec):
    temperature: float = 0.6
    max_turns: int = 10
    repetition: RepetitionStop | None = field(default_factory=RepetitionStop)  # None: no repetition stop


async def answer(engine: Engine, sandbox: Sandbox, fmt: ChatFormat, prompt_ids: list[int], opts: ChatOptions,
                 renderer: OnEvent | None) -> Trajectory:
    """One answer to a prompt already rendered (`prompt_ids`), with the chat's sampling and budgets."""
    cfg = AgentConfig(max_turns=opts.max_turns, max_response_tokens=opts.max_tokens, repetition=opts.repetition,
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
    renderer: OnEvent | None = None
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


