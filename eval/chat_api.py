"""`--api chat`: the tool loop run client-side over `/v1/chat/completions` with `tools`, for servers that
only speak chat (hosted APIs). The server returns `tool_calls`; we run them in our sandbox and send the
results back as `tool` messages, until the model answers without a call or a budget is spent.

There are no token ids here: the trajectory keeps each turn's text, tool calls and the server's token counts.
"""

from __future__ import annotations

import json
import time
from typing import Any

from rstar2_agent.agent import AgentConfig, Execute, run_calls, stop_after_turn
from rstar2_agent.chat_format import (
    SYSTEM_PROMPT,
    USER_TEMPLATE,
    HermesFormat,
    ToolCall,
    answer_scope,
    cap_calls,
    default_tools,
    extract_answer,
    validate_arguments,
)
from rstar2_agent.engines.base import call_seed
from rstar2_agent.sandbox import Sandbox
from rstar2_agent.trajectory import Trajectory, Turn

# servers that take vLLM's chat_template_kwargs (what /v1/models gives as owned_by)
TEMPLATE_KWARGS_SERVERS = ("rstar2", "vllm", "sglang")


class ChatAPIAgent:
    def __init__(self, url: str, model: str | None, api_key: str | None, sandbox: Sandbox | None,
                 timeout: float = 600.0):
        from openai import AsyncOpenAI

        base = url.rstrip("/")
        self.client = AsyncOpenAI(base_url=base if base.endswith("/v1") else base + "/v1", api_key=api_key or "none",
                                  timeout=timeout, max_retries=0)  # the harness retries, with back-off
        self.model, self.sandbox = model, sandbox
        self.owner: str | None = None  # the serving software, as /v1/models says (owned_by)

    async def _model(self) -> str:
        if self.model is None or self.owner is None:
            import openai

            try:
                models = await self.client.models.list()
            except openai.OpenAIError:
                if self.model is None:
                    raise
                self.owner = ""  # a server without /v1/models: nothing known of its template
                return self.model
            self.model = self.model or models.data[0].id
            self.owner = next((m.owned_by for m in models.data if m.id == self.model), "") or ""
        return self.model

    async def _template_kwargs(self, problem_prefix: bool) -> Any:
        """`problem_prefix=False` (IFEval, Arena-Hard: the benchmark's prompt alone): vLLM's `chat_template_kwargs`
        to the servers whose templates may add the math-problem instruction (rstar2 serve in an rStar2 format, or
        vLLM/SGLang serving the release's template); other servers get the user's text as it is, as always."""
        await self._model()
        if problem_prefix or self.owner not in TEMPLATE_KWARGS_SERVERS:
            return None
        return {"chat_template_kwargs": {"problem_prefix": False}}

    async def __call__(self, prompt: str | list[dict[str, Any]], cfg: AgentConfig,
                       tools: list[dict[str, Any]] | None = None, seed: int | None = None,
                       execute: Execute | None = None, problem_prefix: bool = True) -> Trajectory:
        import openai

        tools = default_tools() if tools is None else tools
        messages = prompt if isinstance(prompt, list) else [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": USER_TEMPLATE.format(problem=prompt)}]
        messages = list(messages)
        traj, t_start = Trajectory(prompt_ids=[]), time.monotonic()
        used, extra = 0, await self._template_kwargs(problem_prefix)
        for turn_index in range(cfg.max_turns):
            room = cfg.max_response_tokens - used
            if room <= 0:
                traj.stop_reason = "max_tokens"
                break
            t0 = time.monotonic()
            try:
                resp = await self.client.chat.completions.create(
                    model=await self._model(), messages=messages, tools=tools or openai.NOT_GIVEN,
                    temperature=cfg.sampling.temperature, top_p=cfg.sampling.top_p,
                    max_tokens=min(cfg.sampling.max_tokens, room),
                    seed=openai.NOT_GIVEN if seed is None else call_seed(seed, turn_index), extra_body=extra)
            except openai.OpenAIError as e:
                traj.fail(e)
                break
            finally:
                traj.timings["generate"] += time.monotonic() - t0
            choice = resp.choices[0]
            msg = choice.message
            n_tokens = resp.usage.completion_tokens if resp.usage else 0
            used += n_tokens
            reasoning = (msg.model_extra or {}).get("reasoning_content")  # a server that splits it out
            turn = Turn(text="\n".join(p for p in (reasoning, msg.content) if p), num_tokens=n_tokens,
                        finish_reason="length" if choice.finish_reason == "length" else "stop")
            traj.turns.append(turn)
            calls = cap_calls([_call(c, tools) for c in msg.tool_calls or []],
                              cfg.max_calls_per_turn or HermesFormat.max_calls_per_turn)
            traj.stop_reason = stop_after_turn(turn.text, bool(calls), choice.finish_reason == "length")
            if traj.stop_reason:
                break
            t0 = time.monotonic()
            turn.tool_calls = await run_calls(calls, turn_index, self.sandbox, cfg, "hermes", execute=execute)
            traj.timings["tools"] += time.monotonic() - t0
            messages.append({"role": "assistant", "content": msg.content, "tool_calls": [
                {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.raw}} for c in calls]})
            messages += [{"role": "tool", "tool_call_id": r.id, "content": r.response} for r in turn.tool_calls]
        else:
            traj.stop_reason = "max_turns"
        traj.answer = extract_answer(answer_scope(traj))
        traj.timings["total"] = time.monotonic() - t_start
        return traj

    async def close(self) -> None:
        await self.client.close()


def _call(c: Any, tools: list[dict[str, Any]]) -> ToolCall:
    """A server's tool call -> ours, validated against the tools like the shared parser does."""
    raw = c.function.arguments or "{}"
    try:
        args = json.loads(raw)
    except json.JSONDecodeError as e:
        return ToolCall(c.function.name, {}, raw, f"the arguments are not valid JSON: {e}", id=c.id)
    return ToolCall(c.function.name, args if isinstance(args, dict) else {}, raw,
                    validate_arguments(c.function.name, args, tools), id=c.id)
