"""Seeded synthetic tool-use problems and conversations in our format (shared by train's SFT data and RL prompts
and eval's `synth` benchmark). For the non-reasoning SFT stage: problems whose
answer a short Python program computes, solved as rStar2-Agent's model should (one sentence, one call to
the Python tool, then `<answer>...\\boxed{}...</answer>`), with no reasoning text to imitate.

The tool's reply is rendered exactly as the agent loop renders a sandbox result (chat_format.format_result),
so SFT sees the tokens serving will show. The same generator with another seed gives held-out problems
(`problems(seed, n)`), which the `synth` eval benchmark uses to measure the format before and after SFT.
"""

from __future__ import annotations

import json
import math
import random
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .chat_format import default_tools, problem_message, tool_message
from .problem import Problem
from .sandbox.tools import STATELESS_TOOL
from .sandbox.types import ExecResult, Status


@dataclass(frozen=True, kw_only=True)
class SynthProblem(Problem):
    """A problem with the program that solves it (what the SFT records call)."""
    code: str  # a program that prints the answer


def _sum_range(r: random.Random):
    a, b = r.randint(1, 200), r.randint(300, 5000)
    return (f"What is the sum of all integers from {a} to {b}?", f"print(sum(range({a}, {b} + 1)))",
            sum(range(a, b + 1)))


def _comb(r: random.Random):
    n = r.randint(10, 40)
    k = r.randint(2, n // 2)
    return (f"In how many ways can {k} people be chosen from a group of {n}?",
            f"import math\nprint(math.comb({n}, {k}))", math.comb(n, k))


def _gcd(r: random.Random):
    a, b = r.randint(100, 99999), r.randint(100, 99999)
    return (f"What is the greatest common divisor of {a} and {b}?", f"import math\nprint(math.gcd({a}, {b}))",
            math.gcd(a, b))


def _powmod(r: random.Random):
    a, e, m = r.randint(2, 99), r.randint(50, 5000), r.randint(7, 1000)
    return (f"What is the remainder when {a}^{{{e}}} is divided by {m}?", f"print(pow({a}, {e}, {m}))", pow(a, e, m))


def _divisors(r: random.Random):
    n = r.randint(100, 200000)
    count = sum(1 for d in range(1, n + 1) if n % d == 0)
    return (f"How many positive divisors does {n} have?",
            f"n = {n}\nprint(sum(1 for d in range(1, n + 1) if n % d == 0))", count)


def _primes(r: random.Random):
    n = r.randint(50, 20000)
    sieve = [True] * (n + 1)
    for i in range(2, int(n ** 0.5) + 1):
        if sieve[i]:
            sieve[i * i::i] = [False] * len(sieve[i * i::i])
    count = sum(sieve[2:])
    return (f"How many prime numbers are less than or equal to {n}?",
            f"n = {n}\nprint(sum(all(k % p for p in range(2, int(k ** 0.5) + 1)) for k in range(2, n + 1)))", count)


def _digit_sum(r: random.Random):
    a, e = r.randint(2, 9), r.randint(20, 300)
    return (f"What is the sum of the digits of {a}^{{{e}}}?", f"print(sum(int(c) for c in str({a} ** {e})))",
            sum(int(c) for c in str(a ** e)))


def _trailing_zeros(r: random.Random):
    n = r.randint(20, 3000)
    zeros, p = 0, 5
    while p <= n:
        zeros, p = zeros + n // p, p * 5
    return (f"How many zeros does {n}! end with?",
            f"n, zeros, p = {n}, 0, 5\nwhile p <= n:\n    zeros, p = zeros + n // p, p * 5\nprint(zeros)", zeros)


def _squares(r: random.Random):
    n = r.randint(10, 500)
    return (f"What is the sum of the squares of the first {n} positive integers?",
            f"print(sum(k * k for k in range(1, {n} + 1)))", sum(k * k for k in range(1, n + 1)))


def _fib(r: random.Random):
    n = r.randint(20, 90)
    a, b = 0, 1
    for _ in range(n):
        a, b = b, a + b
    return (f"What is the {n}th Fibonacci number, with F(1) = F(2) = 1?",
            f"a, b = 0, 1\nfor _ in range({n}):\n    a, b = b, a + b\nprint(a)", a)


FAMILIES: dict[str, Callable[[random.Random], tuple[str, str, int]]] = {f.__name__[1:]: f for f in (
    _sum_range, _comb, _gcd, _powmod, _divisors, _primes, _digit_sum, _trailing_zeros, _squares, _fib)}


def parse_families(text: str | None) -> tuple[str, ...]:
    """"primes+fib" (or "primes,fib") -> ("primes", "fib"); None, "" or "all": every family."""
    if not text or text == "all":
        return tuple(FAMILIES)
    names = tuple(n.strip() for n in re.split(r"[+,]", text) if n.strip())
    unknown = [n for n in names if n not in FAMILIES]
    if unknown or not names:
        raise ValueError(f"unknown synthetic problem famil{'ies' if len(unknown) > 1 else 'y'} "
                         f"{', '.join(unknown) or text!r}: choose from {', '.join(FAMILIES)} (joined with +)")
    return names


OPENERS = ["I will compute this with Python.", "Let me calculate it with a short program.",
           "I'll use the Python tool to get the exact value.", "A quick computation settles this."]


def problems(seed: int, n: int, families: str | None = None) -> list[SynthProblem]:
    """`n` problems drawn with `seed` from `families` (parse_families; every family by default). A subset's ids
    name it, so problems of different subsets never share an id."""
    names = parse_families(families)
    makers = [FAMILIES[name] for name in names]
    tag = "" if len(names) == len(FAMILIES) else "+".join(names) + "-"
    r = random.Random(seed)
    out = []
    for i in range(n):
        text, code, answer = r.choice(makers)(r)
        out.append(SynthProblem(f"{tag}{seed}-{i}", text, str(answer), "synthetic", code=code))
    return out


def conversation(p: SynthProblem, r: random.Random) -> dict[str, Any]:
    """One OpenAI-style chat record (messages with tool_calls and a tool turn, plus tools)."""
    args, call_id = {"code": p.code}, f"call_{p.id}"
    openai_call = {"id": call_id, "type": "function",
                   "function": {"name": STATELESS_TOOL, "arguments": json.dumps(args)}}
    return {  # no system turn: each format gives its own (hermes: SYSTEM_PROMPT with the tools)
        "messages": [
            problem_message(p.text),
            {"role": "assistant", "content": r.choice(OPENERS), "tool_calls": [openai_call]},
            tool_message(call_id, STATELESS_TOOL, ExecResult(Status.OK, stdout=p.answer + "\n", duration=0.01)),
            {"role": "assistant", "content": f"<answer>The answer is \\boxed{{{p.answer}}}.</answer>"},
        ],
        "tools": default_tools(),
    }


def conversations(seed: int, n: int, families: str | None = None) -> list[dict[str, Any]]:
    r = random.Random(seed + 1)
    return [conversation(p, r) for p in problems(seed, n, families)]
