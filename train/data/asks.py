"""Everyday "compute this" asks, the data that makes the default agent (`smollm2-agent`) an agent for what a
newcomer types: "What is 2**100? Use Python.", "Compute 30 factorial", "How many primes are below 5000?".

rstar2_agent/synthetic.py's ten families each have one phrasing and serve RL's curriculum; a 135M model taught
on them alone writes one of those ten programs for any question (`pow(3, 50, 6)` for "3**50"). Here each of many
families has several phrasings (symbols and words, with or without "Use Python."), and each program is the
direct translation of the question (`print(3 ** 50)`), so the model learns to carry the question's numbers and
operation into the code. The conversations are synthetic.conversation's: one sentence, one call to the Python
tool, its output, then `<answer>\\boxed{}</answer>`. The held-out prompts the agent is measured on
(tests/data/agent_held_out.jsonl) were written apart from this file, by a hand that never read it."""

from __future__ import annotations

import contextlib
import io
import random
import re
from collections.abc import Callable
from typing import Any

from rstar2_agent.synthetic import OPENERS, SynthProblem, conversation

from . import tool_tasks
from .tool_tasks import Bug, ToolProblem

Ask = tuple[str, str]  # the question, the program that prints its answer (the answer is what it prints)

SUFFIXES = ["", "", " Use Python.", " Use Python.", " Use the Python tool.", " Please compute it exactly.",
            " Give the exact value.", " Use Python to check.", " Compute it with Python.",
            " Give the answer as an integer."]
PREFIXES = ["", "", "", "", "Use Python: ", "Using Python, ", "Quick question: ", "Please help: "]
_WORDS = {100: "one hundred", 1000: "one thousand", 10 ** 4: "ten thousand", 10 ** 5: "one hundred thousand",
          10 ** 6: "one million", 10 ** 9: "one billion"}


def _pick(r: random.Random, *phrasings: str) -> str:
    return r.choice(phrasings)


def _num(r: random.Random, n: int) -> str:
    """`n` as people write it in a question: digits, with thousands separators, or in words for a round number;
    the program always holds the integer."""
    if n in _WORDS and r.random() < 0.4:
        return _WORDS[n]
    return f"{n:,}" if n >= 10 ** 4 and r.random() < 0.35 else str(n)


def _bound(r: random.Random, lo: int, hi: int) -> int:
    """A size or limit: often a round one (a thousand, a million), as people ask."""
    rounds = [n for n in _WORDS if lo <= n <= hi]
    return r.choice(rounds) if rounds and r.random() < 0.35 else r.randint(lo, hi)


def _power(r: random.Random) -> Ask:
    a, b = r.randint(2, 99), r.randint(10, 80)
    q = _pick(r, f"What is {a}**{b}?", f"Compute {a}^{b}.", f"What is {a} to the power of {b}?",
              f"Calculate {a} raised to the power {b}.", f"What is {a}^{b}?", f"Evaluate {a}**{b}.",
              f"What do you get when you raise {a} to the {_ordinal(b)} power?")
    return q, f"print({a} ** {b})"


def _power_offset(r: random.Random) -> Ask:
    a, b, c = r.choice([2, 2, 3, 5, 7, 10]), r.randint(20, 128), r.randint(1, 99)
    sign = r.choice(["+", "-"])
    q = _pick(r, f"What is {a}**{b} {sign} {c}?", f"Compute {a}^{b} {sign} {c}.", f"Evaluate {a}**{b} {sign} {c}.")
    return q, f"print({a} ** {b} {sign} {c})"


def _product(r: random.Random) -> Ask:
    a, b = r.randint(1000, 10 ** r.randint(5, 12)), r.randint(1000, 10 ** r.randint(5, 12))
    q = _pick(r, f"What is {a} * {b}?", f"What is {a} times {b}?", f"Multiply {a} by {b}.",
              f"Compute {a}*{b}.", f"What is the product of {a} and {b}?", f"Compute {a} * {b} exactly.",
              f"What is {a} x {b}?")
    return q, f"print({a} * {b})"


def _sum_terms(r: random.Random) -> Ask:
    terms = [r.randint(100, 10 ** 9) for _ in range(r.randint(3, 5))]
    listed = ", ".join(map(str, terms[:-1])) + f" and {terms[-1]}"
    q = _pick(r, f"What is {' + '.join(map(str, terms))}?", f"Add {listed}.", f"What is the sum of {listed}?",
              f"What do {listed} add up to?")
    return q, f"print({' + '.join(map(str, terms))})"


def _expression(r: random.Random) -> Ask:
    a, b, c, d = (r.randint(10, 9999) for _ in range(4))
    expr = r.choice([f"({a} + {b}) * {c} - {d}", f"{a} * {b} - {c} * {d}", f"({a} - {b}) * ({c} + {d})",
                     f"{a} * {b} * {c} + {d}", f"{a} ** 3 - {b} * {c}"])
    q = _pick(r, f"What is {expr}?", f"Compute {expr}.", f"Evaluate {expr}.", f"What is the value of {expr}?")
    return q, f"print({expr})"


def _factorial(r: random.Random) -> Ask:
    n = r.randint(10, 60)
    q = _pick(r, f"What is {n}!?", f"Compute {n} factorial.", f"What is the factorial of {n}?",
              f"Calculate {n}!.", f"What is {n} factorial?", f"Compute {n}!.", f"What is the value of {n}!?")
    return q, f"import math\nprint(math.factorial({n}))"


def _digit_sum(r: random.Random) -> Ask:
    kind = r.randint(0, 2)
    if kind == 0:
        n = r.randint(10, 200)
        what, expr = f"{n}!", f"math.factorial({n})"
    elif kind == 1:
        a, b = r.randint(2, 9), r.randint(20, 1000)
        what, expr = r.choice([f"{a}**{b}", f"{a}^{b}"]), f"{a} ** {b}"
    else:
        n = r.randint(10 ** 8, 10 ** 15)
        what, expr = str(n), str(n)
    head = "import math\n" if "math." in expr else ""
    q = _pick(r, f"What is the sum of the digits of {what}?", f"Find the digit sum of {what}.",
              f"What is the sum of the digits of the number {what}?", f"Add up the digits of {what}.",
              f"What do the digits of {what} add up to?")
    return q, f"{head}print(sum(int(c) for c in str({expr})))"


def _digit_count(r: random.Random) -> Ask:
    if r.random() < 0.5:
        a, b = r.randint(2, 99), r.randint(20, 500)
        what, expr, head = r.choice([f"{a}**{b}", f"{a}^{b}"]), f"{a} ** {b}", ""
    else:
        n = r.randint(20, 500)
        what, expr, head = f"{n}!", f"math.factorial({n})", "import math\n"
    q = _pick(r, f"How many digits does {what} have?", f"How many digits are in {what}?",
              f"How many decimal digits does {what} have?", f"Count the digits of {what}.")
    return q, f"{head}print(len(str({expr})))"


def _sum_range(r: random.Random) -> Ask:
    a = r.choice([1, 1, r.randint(2, 50)])
    b = _bound(r, 100, 10 ** 6)
    q = _pick(r, f"What is the sum of all integers from {a} to {_num(r, b)}?",
              f"Sum the numbers from {a} to {_num(r, b)}.",
              f"What is {a} + {a + 1} + ... + {b}?", f"Add up every integer from {a} through {_num(r, b)}.",
              f"What is the sum of the integers between {a} and {_num(r, b)} inclusive?")
    return q, f"print(sum(range({a}, {b} + 1)))"


def _power_sum(r: random.Random) -> Ask:
    n, k = _bound(r, 10, 2000), r.choice([2, 2, 3, 3, 4])
    name = {2: "squares", 3: "cubes", 4: "fourth powers"}[k]
    q = _pick(r, f"What is the sum of the {name} of the integers from 1 to {_num(r, n)}?",
              f"What is 1^{k} + 2^{k} + ... + {n}^{k}?", f"Compute the sum of k**{k} for k from 1 to {n}.",
              f"What is the sum of the {name} of the first {_num(r, n)} positive integers?",
              f"Add up the {name} of 1, 2, ..., {n}.")
    return q, f"print(sum(k ** {k} for k in range(1, {n} + 1)))"


def _multiples(r: random.Random) -> Ask:
    a, b, n = r.randint(2, 9), r.randint(2, 13), _bound(r, 100, 10 ** 5)
    if r.random() < 0.5:
        q = _pick(r, f"What is the sum of all multiples of {a} or {b} below {_num(r, n)}?",
                  f"Find the sum of the natural numbers less than {_num(r, n)} that are divisible by {a} or {b}.",
                  f"What is the sum of all integers from 1 to {_num(r, n - 1)} that are divisible by {a} or {b}?",
                  f"Add up the numbers below {_num(r, n)} that are multiples of {a} or {b}.")
        return q, f"print(sum(k for k in range(1, {n}) if k % {a} == 0 or k % {b} == 0))"
    q = _pick(r, f"How many integers from 1 to {_num(r, n)} are divisible by {a} or {b}?",
              f"Count the numbers between 1 and {_num(r, n)} that are multiples of {a} or {b}.",
              f"How many numbers up to {_num(r, n)} are divisible by {a} or by {b}?")
    return q, f"print(sum(1 for k in range(1, {n} + 1) if k % {a} == 0 or k % {b} == 0))"


_PRIME = "def is_prime(k):\n    return k > 1 and all(k % p for p in range(2, int(k ** 0.5) + 1))\n"


def _prime_count(r: random.Random) -> Ask:
    n = _bound(r, 50, 3 * 10 ** 4)
    below = r.random() < 0.5
    q = (_pick(r, f"How many primes are there below {_num(r, n)}?",
                  f"How many prime numbers are less than {_num(r, n)}?",
               f"Count the primes smaller than {_num(r, n)}.", f"How many primes are there under {_num(r, n)}?")
         if below else
         _pick(r, f"How many primes are there up to {_num(r, n)}?", f"How many prime numbers are at most {_num(r, n)}?",
               f"Count the primes from 1 to {_num(r, n)}.", f"How many primes are there between 1 and {_num(r, n)}?"))
    bound = f"{n}" if below else f"{n} + 1"
    return q, f"{_PRIME}print(sum(1 for k in range({bound}) if is_prime(k)))"


def _prime_sum(r: random.Random) -> Ask:
    n = _bound(r, 50, 3 * 10 ** 4)
    q = _pick(r, f"What is the sum of all primes below {_num(r, n)}?",
              f"Add up the prime numbers less than {_num(r, n)}.",
              f"Compute the sum of all prime numbers less than {_num(r, n)}.",
              f"What do the primes under {_num(r, n)} add up to?")
    return q, f"{_PRIME}print(sum(k for k in range({n}) if is_prime(k)))"


def _nth_prime(r: random.Random) -> Ask:
    n = _bound(r, 10, 5000)
    q = _pick(r, f"What is the {_ordinal(n)} prime number?", f"Find the {_ordinal(n)} prime.",
              f"What is the {_ordinal(n)} prime?", f"Which number is the {_ordinal(n)} prime?")
    return q, f"{_PRIME}count, k = 0, 1\nwhile count < {n}:\n    k += 1\n    count += is_prime(k)\nprint(k)"


def _largest_prime_factor(r: random.Random) -> Ask:
    n = r.randint(1000, 10 ** 12)
    q = _pick(r, f"What is the largest prime factor of {n}?", f"Find the biggest prime that divides {n}.",
              f"What is the greatest prime factor of {n}?")
    code = (f"n, p, largest = {n}, 2, 1\nwhile p * p <= n:\n    while n % p == 0:\n        n, largest = n // p, p\n"
            "    p += 1\nprint(max(largest, n) if n > 1 else largest)")
    return q, code


def _fibonacci(r: random.Random) -> Ask:
    n = r.randint(10, 300)
    q = _pick(r, f"What is the {_ordinal(n)} Fibonacci number?", f"Compute Fibonacci({n}), with F(1) = F(2) = 1.",
              f"What is F({n}) in the Fibonacci sequence starting 1, 1?",
              f"What is the {_ordinal(n)} Fibonacci number, if F(1) = F(2) = 1?",
              f"Find the {_ordinal(n)} Fibonacci number.")
    return q, f"a, b = 0, 1\nfor _ in range({n}):\n    a, b = b, a + b\nprint(a)"


def _gcd_lcm(r: random.Random) -> Ask:
    a, b = r.randint(12, 10 ** 9), r.randint(12, 10 ** 9)
    g = r.randint(2, 999)
    a, b = a * g, b * g
    if r.random() < 0.5:
        q = _pick(r, f"What is gcd({a}, {b})?", f"Find the greatest common divisor of {a} and {b}.",
                  f"What is the GCD of {a} and {b}?", f"What is the greatest common factor of {a} and {b}?",
                  f"What is the highest common factor of {a} and {b}?")
        return q, f"import math\nprint(math.gcd({a}, {b}))"
    q = _pick(r, f"What is lcm({a}, {b})?", f"Find the least common multiple of {a} and {b}.",
              f"What is the LCM of {a} and {b}?", f"What is the lowest common multiple of {a} and {b}?")
    return q, f"import math\nprint(math.lcm({a}, {b}))"


def _lcm_range(r: random.Random) -> Ask:
    n = r.randint(5, 60)
    q = _pick(r, f"What is the smallest positive number divisible by every integer from 1 to {n}?",
              f"What is the least common multiple of 1, 2, ..., {n}?",
              f"Find the least common multiple of all the numbers from 1 to {n}.",
              f"What is the LCM of the integers 1 through {n}?",
              f"What is the smallest number that every integer from 1 to {n} divides?")
    return q, f"import math\nprint(math.lcm(*range(1, {n} + 1)))"


def _powmod(r: random.Random) -> Ask:
    a, e, m = r.randint(2, 999), r.randint(10, 10 ** 6), r.randint(7, 10 ** 7)
    q = _pick(r, f"What is {a}**{e} mod {m}?", f"What is {a}^{e} modulo {m}?",
              f"Find the remainder when {a}^{e} is divided by {m}.", f"Compute {a}^{e} mod {m}.",
              f"What is {a}**{e} modulo {m}?", f"What is the remainder of {a}**{e} divided by {m}?")
    return q, f"print(pow({a}, {e}, {m}))"


def _last_digits(r: random.Random) -> Ask:
    a, e, k = r.randint(2, 99), r.randint(10, 10 ** 5), r.choice([2, 3, 4, 5, 6, 8])
    q = _pick(r, f"What number do the last {k} digits of {a}^{e} form?",
              f"What is {a}**{e} modulo 10**{k} (its last {k} digits)?",
              f"What are the last {k} digits of {a}**{e}? Give the answer as an integer.",
              f"Find the last {k} digits of {a}^{e}, as a number.")
    return q, f"print(pow({a}, {e}, 10 ** {k}))"


def _division(r: random.Random) -> Ask:
    a, b = r.randint(10 ** 4, 10 ** 12), r.randint(3, 10 ** 5)
    if r.random() < 0.5:
        q = _pick(r, f"What is {a} mod {b}?", f"What is the remainder when {a} is divided by {b}?",
                  f"What is {a} % {b}?", f"What is {a} modulo {b}?")
        return q, f"print({a} % {b})"
    q = _pick(r, f"What is {a} // {b}?", f"What is {a} divided by {b}, rounded down?",
              f"What is the integer quotient of {a} divided by {b}?")
    return q, f"print({a} // {b})"


def _choose(r: random.Random) -> Ask:
    n = r.randint(8, 100)
    k = r.randint(2, min(n - 1, 30))
    if r.random() < 0.6:
        q = _pick(r, f"What is {n} choose {k}?", f"Compute C({n}, {k}).",
                  f"In how many ways can {k} items be chosen from {n}?", f"What is the binomial coefficient ({n} {k})?",
                  f"How many ways can I choose {k} numbers out of {n}?",
                  f"How many different committees of {k} people can be formed from {n} people?")
        return q, f"import math\nprint(math.comb({n}, {k}))"
    q = _pick(r, f"How many ordered arrangements of {k} items can be made from {n} distinct items?",
              f"What is P({n}, {k}), the number of permutations of {k} out of {n}?",
              f"In how many ways can {k} runners out of {n} finish first to {_ordinal(k)}?")
    return q, f"import math\nprint(math.perm({n}, {k}))"


def _divisors(r: random.Random) -> Ask:
    n = r.randint(100, 10 ** 6)
    if r.random() < 0.5:
        q = _pick(r, f"How many divisors does {n} have?", f"How many positive divisors does {n} have?",
                  f"Count the divisors of {n}.", f"How many factors does {n} have?")
        return q, f"print(sum(1 for d in range(1, {n} + 1) if {n} % d == 0))"
    q = _pick(r, f"What is the sum of the divisors of {n}?", f"What is the sum of all positive divisors of {n}?",
              f"What is the sum of all the divisors of {n}, including 1 and {n} itself?",
              f"Add up every divisor of {n}.")
    return q, f"print(sum(d for d in range(1, {n} + 1) if {n} % d == 0))"


def _squares(r: random.Random) -> Ask:
    n = _bound(r, 10 ** 3, 10 ** 12)
    if r.random() < 0.5:
        q = _pick(r, f"How many perfect squares are there from 1 to {_num(r, n)}?",
                  f"How many perfect squares are less than or equal to {_num(r, n)}?")
        return q, f"import math\nprint(math.isqrt({n}))"
    q = _pick(r, f"What is the integer square root of {n}?", f"What is the floor of the square root of {n}?")
    return q, f"import math\nprint(math.isqrt({n}))"


def _squares_or_cubes(r: random.Random) -> Ask:
    n = _bound(r, 100, 10 ** 6)
    q = _pick(r, f"How many numbers from 1 to {_num(r, n)} are perfect squares or perfect cubes?",
              f"How many integers between 1 and {_num(r, n)} (inclusive) are a square or a cube?",
              f"Count the perfect squares and perfect cubes up to {_num(r, n)}, counting each number once.")
    code = (f"import math\nn = {n}\nsquares = {{k * k for k in range(1, math.isqrt(n) + 1)}}\n"
            "cubes = {k ** 3 for k in range(1, round(n ** (1 / 3)) + 2) if k ** 3 <= n}\nprint(len(squares | cubes))")
    return q, code


def _triangular(r: random.Random) -> Ask:
    n = r.randint(10, 10 ** 5)
    q = _pick(r, f"What is the {_ordinal(n)} triangular number?", f"Compute the triangular number T({n}).")
    return q, f"print({n} * ({n} + 1) // 2)"


def _binary(r: random.Random) -> Ask:
    n = r.randint(100, 10 ** 9)
    kind = r.randint(0, 2)
    if kind == 0:
        bits = bin(n)[2:]
        q = _pick(r, f"What is the binary number {bits} in decimal?", f"Convert {bits} from base 2 to base 10.",
                  f"Convert the binary number {bits} to decimal.", f"What is {bits} (base 2) in base 10?")
        return q, f"print(int('{bits}', 2))"
    if kind == 1:
        digits = hex(n)[2:].upper()
        q = _pick(r, f"What is the hexadecimal number {digits} in decimal?", f"Convert 0x{digits} to decimal.",
                  f"Convert the hex number {digits} to decimal.")
        return q, f"print(int('{digits}', 16))"
    q = _pick(r, f"How many 1s are in the binary representation of {n}?", f"How many bits of {n} are set?")
    return q, f"print(bin({n}).count('1'))"


def _to_base(r: random.Random) -> Ask:
    n, b = r.randint(10, 10 ** 6), r.randint(3, 9)
    q = _pick(r, f"Write {n} in base {b}.", f"What is {n} in base {b}?", f"Convert {n} to base {b}.",
              f"What are the digits of {n} in base {b}? Give them as one number.")
    code = f"n, digits = {n}, ''\nwhile n:\n    n, d = divmod(n, {b})\n    digits = str(d) + digits\nprint(digits)"
    return q, code


def _collatz(r: random.Random) -> Ask:
    n = r.randint(5, 10 ** 6)
    q = _pick(r, f"How many steps does the Collatz sequence starting at {n} take to reach 1?",
              f"Starting from {n}, how many Collatz steps (n/2 if even, 3n+1 if odd) reach 1?",
              f"Starting from {n}, apply the Collatz rule (halve if even, else 3n+1) until you reach 1. How many steps "
              "does it take?")
    code = (f"n, steps = {n}, 0\nwhile n != 1:\n    n, steps = (n // 2 if n % 2 == 0 else 3 * n + 1), steps + 1\n"
            "print(steps)")
    return q, code


def _trailing_zeros(r: random.Random) -> Ask:
    n = _bound(r, 10, 10 ** 4)
    q = _pick(r, f"How many trailing zeros does {n}! have?", f"How many zeros does {n} factorial end with?",
              f"How many zeros are at the end of {n}!?", f"How many trailing zeroes are there in {n} factorial?")
    return q, f"n, zeros, p = {n}, 0, 5\nwhile p <= n:\n    zeros, p = zeros + n // p, p * 5\nprint(zeros)"


def _totient(r: random.Random) -> Ask:
    n = _bound(r, 10, 10 ** 5)
    q = _pick(r, f"What is Euler's totient of {_num(r, n)}?", f"What is phi({n}), Euler's totient function?",
              f"How many integers from 1 to {_num(r, n)} are coprime to {n}?",
              f"Compute Euler's phi function at {n}.")
    return q, f"import math\nprint(sum(1 for k in range(1, {n} + 1) if math.gcd(k, {n}) == 1))"


def _catalan(r: random.Random) -> Ask:
    n = r.randint(3, 60)
    q = _pick(r, f"What is the {_ordinal(n)} Catalan number?", f"Compute the Catalan number C_{n}.",
              f"What is Catalan({n})?")
    return q, f"import math\nprint(math.comb(2 * {n}, {n}) // ({n} + 1))"


_WORDS_TO_ARRANGE = ["BANANA", "BALLOON", "STATISTICS", "COMMITTEE", "MATHEMATICS", "ASSESSMENT", "TENNESSEE",
                     "BOOKKEEPER", "PEPPER", "LETTER", "SUCCESS", "ALABAMA", "PARALLEL", "REFERENCE", "COFFEE",
                     "GOOGOL", "ENGINEERING", "PROBABILITY", "CALCULUS", "ARRANGEMENT", "APPLE", "LEVEL"]


def _anagrams(r: random.Random) -> Ask:
    word = r.choice(_WORDS_TO_ARRANGE)
    q = _pick(r, f"How many different ways can the letters of the word {word} be arranged?",
              f"How many distinct arrangements of the letters of {word} are there?",
              f"In how many ways can you rearrange the letters of {word}?")
    code = (f"import math\nfrom collections import Counter\nword = '{word}'\nways = math.factorial(len(word))\n"
            "for count in Counter(word).values():\n    ways //= math.factorial(count)\nprint(ways)")
    return q, code


def _coins(r: random.Random) -> Ask:
    coins, unit = r.choice([([1, 5, 10, 25], "cents"), ([1, 5, 10, 25, 50], "cents"), ([1, 2, 5, 10, 20, 50], "pence"),
                            ([1, 2, 5], "cents"), ([1, 3, 7], "units")])
    amount = r.randint(10, 300)
    listed = ", ".join(map(str, coins[:-1])) + f" and {coins[-1]}"
    q = _pick(r, f"In how many ways can you make {amount} {unit} using coins of {listed} {unit}?",
              f"How many ways are there to make change for {amount} {unit} with coins worth {listed} {unit}?")
    code = (f"ways = [1] + [0] * {amount}\nfor coin in {coins}:\n    for v in range(coin, {amount} + 1):\n"
            f"        ways[v] += ways[v - coin]\nprint(ways[{amount}])")
    return q, code


def _digit_sum_count(r: random.Random) -> Ask:
    k = r.randint(2, 5)
    s = r.randint(2, 9 * k - 2)
    q = _pick(r, f"How many {k}-digit numbers have digits that add up to {s}?",
              f"How many {k}-digit positive integers have a digit sum of {s}?",
              f"Count the {k}-digit numbers whose digits sum to {s}.")
    return q, f"print(sum(1 for x in range(10 ** {k - 1}, 10 ** {k}) if sum(int(c) for c in str(x)) == {s}))"


def _growth(r: random.Random) -> Ask:
    start, factor, n = r.randint(2, 500), r.choice([2, 2, 3]), r.randint(5, 80)
    verb = {2: "doubles", 3: "triples"}[factor]
    thing, period = r.choice([("bacteria", "hour"), ("cells", "minute"), ("followers", "month"), ("rabbits", "year")])
    q = _pick(r, f"A colony of {start} {thing} {verb} every {period}. How many {thing} are there after {n} {period}s?",
              f"There are {start} {thing}, and their number {verb} every {period}. How many after {n} {period}s? "
              "Compute it exactly.",
              f"Start with {start} {thing}. If the number {verb} each {period}, how many are there after {n} "
              f"{period}s?")
    return q, f"print({start} * {factor} ** {n})"


def _interest(r: random.Random) -> Ask:
    money, rate, years = r.choice([100, 500, 1000, 2000, 5000, 10000]), r.choice([2, 3, 4, 5, 6, 8, 10, 12]), \
        r.randint(2, 40)
    q = _pick(r, f"I put ${money} in an account that pays {rate}% interest per year, and the bank rounds down to "
              f"whole dollars each year. How many dollars do I have after {years} years?",
              f"A deposit of ${money} earns {rate}% a year, compounded yearly and rounded down to a whole dollar each "
              f"year. What is it worth after {years} years?")
    return q, f"money = {money}\nfor _ in range({years}):\n    money = money * (100 + {rate}) // 100\nprint(money)"


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


FAMILIES: dict[str, Callable[[random.Random], Ask]] = {f.__name__[1:]: f for f in (
    _power, _power_offset, _product, _sum_terms, _expression, _factorial, _digit_sum, _digit_count, _sum_range,
    _power_sum, _multiples, _prime_count, _prime_sum, _nth_prime, _largest_prime_factor, _fibonacci, _gcd_lcm,
    _lcm_range, _powmod, _last_digits, _division, _choose, _divisors, _squares, _squares_or_cubes, _triangular,
    _binary, _to_base, _collatz, _trailing_zeros, _totient, _catalan, _anagrams, _coins, _digit_sum_count, _growth,
    _interest)}


def output(code: str) -> str:
    """What a family's program prints: the ask's answer, so program and answer cannot disagree (run here, in this
    process: the program is our own, from the templates above; tests/train/test_asks.py runs them in the sandbox)."""
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(code, {})  # noqa: S102 - our own generated program
    return printed.getvalue().strip()


def problems(seed: int, n: int) -> list[SynthProblem]:
    """`n` asks drawn with `seed`, the families taken in turn (each about equally often), a suffix drawn for each."""
    r = random.Random(seed)
    names = list(FAMILIES)
    out = []
    for i in range(n):
        family = names[i % len(names)]
        text, code = FAMILIES[family](r)
        prefix = r.choice(PREFIXES)
        text = prefix + (text[0].lower() + text[1:] if prefix and not text[:2].isupper() else text)
        out.append(SynthProblem(f"ask-{seed}-{i}", text + r.choice(SUFFIXES), output(code), "asks",
                                meta={"family": family}, code=code))
    return out


def first_try(code: str, r: random.Random) -> Bug | None:
    """A failing first try at a program that imports math, as a small model's first tries fail: the import left
    out, or the function called by its bare name (`gcd(a, b)`); None for a program without that import."""
    if "import math\n" not in code:
        return None
    body = code.replace("import math\n", "", 1)
    names = list(dict.fromkeys(re.findall(r"math\.(\w+)\(", body)))
    if names and r.random() < 0.5:
        return Bug(re.sub(r"math\.(\w+)\(", r"\1(", body), r.choice(BARE_NAME).format(name=names[0]))
    return Bug(body, r.choice(NO_IMPORT))


NO_IMPORT = ["I forgot to import math. Again, with the import:", "The math module was not imported; fixing that.",
             "NameError: math needs `import math` first. Let me rerun it."]
BARE_NAME = ["`{name}` lives in the math module: calling it as math.{name} after importing math.",
             "{name} is not a builtin; it is math.{name}. Fixed:", "I need `import math` and math.{name}. Again:"]


def conversations(seed: int, n: int, error_share: float = 0.0) -> list[dict[str, Any]]:
    """The asks' chat records; `error_share` of those whose program imports math (a seeded draw each) instead
    call a failing first try (`first_try`), read the sandbox's real error, say what was wrong and call the
    program (tool_tasks.records runs both calls). The first try has weight 0: the model learns to read an error
    and fix it, not to make it."""
    if not 0.0 <= error_share <= 1.0:
        raise ValueError(f"error_share must be between 0 and 1, not {error_share}")
    r, draw = random.Random(seed + 1), random.Random(seed + 2)
    out: list[dict[str, Any] | None] = []
    plans, slots = [], []
    for p in problems(seed, n):
        bug = first_try(p.code, draw) if error_share and draw.random() < error_share else None
        if bug is None:
            out.append(conversation(p, r))
            continue
        plans.append((ToolProblem(**vars(p), stdin="", bugs=(bug,)), r.choice(OPENERS), bug))
        slots.append(len(out))
        out.append(None)
    for slot, record in zip(slots, tool_tasks.records_sync(plans, train_bug=False) if plans else [], strict=True):
        out[slot] = record
    return out
