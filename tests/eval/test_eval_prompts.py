"""What the model sees per benchmark under the rStar2 formats: math in the paper's prompt (Figure 3's system prompt,
the math-problem instruction before the question), IFEval, Arena-Hard and BFCL v3 in their own prompts (the paper:
"each benchmark's default prompt template"), so without that instruction. The real eval agent loop, the real
format and SmolLM2's tokenizer; the engine is scripted and records the ids it is given."""

from __future__ import annotations

import pytest

from rstar2_agent.chat_format import ChatFormat
from rstar2_agent.eval.benchmarks import BENCHMARKS, Context, Problem
from rstar2_agent.eval.runner import EvalConfig, make_agent
from rstar2_agent.grading.math import MathGrader
from rstar2_agent.paper_format import PAPER_SYSTEM
from rstar2_agent.release_format import PROBLEM_PREFIX

from conftest import ScriptedEngine

INSTRUCTION = "This is the problem:"


def context(tokenizer, bench, profile: str, grader=None) -> tuple[Context, ScriptedEngine]:
    engine = ScriptedEngine(tokenizer, ["<reason>ok</reason><answer>\\boxed{5}</answer>"])
    cfg = EvalConfig(use_tools=False).resolve(bench.defaults)
    agent = make_agent(cfg, engine, ChatFormat(tokenizer, profile), sandbox=None)
    return Context(agent=agent, math_grader=grader, seed=0), engine


@pytest.mark.parametrize("profile", ["rstar2-paper", "rstar2-release"])
async def test_ifeval_goes_without_the_math_instruction_and_math_keeps_it(smol_tokenizer, profile):
    ifeval = BENCHMARKS["ifeval"]()
    ctx, engine = context(smol_tokenizer, ifeval, profile)
    question = "Write a haiku about rain. Do not use any commas."
    await ifeval.run(Problem("1", question, '["punctuation:no_comma"]',
                             meta={"instruction_id_list": ["punctuation:no_comma"], "kwargs": [{}]}), 0, ctx)
    (seen,) = [engine.prompt_text(k) for k in range(len(engine.prompts))]
    assert f"<|im_start|>user\n{question}<|im_end|>" in seen and INSTRUCTION not in seen
    assert seen.endswith("<|im_start|>assistant\n<reason>")  # the model's own generation prompt stays
    if profile == "rstar2-paper":
        assert PAPER_SYSTEM in seen

    aime = BENCHMARKS["aime24"]()
    grader = MathGrader(workers=1, timeout=10)
    try:
        ctx, engine = context(smol_tokenizer, aime, profile, grader)
        outcome = await aime.run(Problem("1", "What is 2 + 3?", "5"), 0, ctx)
    finally:
        grader.close()
    assert outcome.correct
    (seen,) = [engine.prompt_text(k) for k in range(len(engine.prompts))]
    assert f"<|im_start|>user\n{PROBLEM_PREFIX}What is 2 + 3?<|im_end|>" in seen


def test_hermes_never_added_the_instruction_to_messages(smol_tokenizer):
    fmt = ChatFormat(smol_tokenizer, "hermes")
    messages = [{"role": "user", "content": "Write a haiku."}]
    assert fmt.render_prompt(messages, []) == fmt.render_prompt(messages, [], problem_prefix=False)
