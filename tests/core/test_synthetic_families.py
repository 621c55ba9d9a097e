"""The synthetic problems' families (rstar2_agent/synthetic.py): a subset for SFT, another for RL and its held-out
eval, as `make train` splits them so that SFT teaches the format and the tool on other tasks than RL's."""

from __future__ import annotations

import pytest

from rstar2_agent.benchmark_data import DataError
from rstar2_agent.synthetic import FAMILIES, parse_families, problems
from rstar2_agent.train.config import RLConfig, SFTConfig, Stage
from rstar2_agent.train.data.converters import load_records
from rstar2_agent.train.data.pool import stage_pool
from rstar2_agent.train.recipe import load

QUESTION_START = {"primes": "How many prime numbers", "gcd": "What is the greatest common divisor"}


def test_a_subset_draws_only_its_families_and_names_them_in_its_ids():
    drawn = problems(3, 40, "primes+gcd")
    assert {p.text.startswith((QUESTION_START["primes"], QUESTION_START["gcd"])) for p in drawn} == {True}
    assert {p.text.startswith(QUESTION_START["primes"]) for p in drawn} == {True, False}  # both families drawn
    assert all(p.id.startswith("primes+gcd-3-") for p in drawn)
    # every family (the default) is the stream it always was: the same seed gives the same problems and ids
    assert [(p.id, p.text) for p in problems(3, 40)] == [(p.id, p.text) for p in problems(3, 40, "all")]
    assert parse_families("primes,fib") == ("primes", "fib") and len(parse_families(None)) == len(FAMILIES) == 10
    with pytest.raises(ValueError, match="unknown synthetic problem family 'prime'.*primes"):
        parse_families("prime+fib")


def test_the_make_train_recipes_split_the_families_between_sft_and_rl():
    sft = load(SFTConfig, "sft-smollm2-cpu")
    rl = load(RLConfig, "rl-smollm2-cpu")
    rl_families = {f for s in rl.stages for f in parse_families(s.data.split(":")[1])}
    rows = {source: int(source.split(":")[1]) for source in sft.data}
    other = [s for s in sft.data if not set(parse_families(s.split(":")[3])) & rl_families]
    # most SFT rows come from other families than RL's; RL's own are a small share (the base model's prior)
    assert rl_families and sum(rows[s] for s in other) >= 7 * (sum(rows.values()) - sum(rows[s] for s in other))
    assert len(rl_families) == 5 and len(set(parse_families(other[0].split(":")[3]))) == 5
    records = load_records("synthetic:6:0:" + other[0].split(":")[3])
    assert len(records) == 6 and all(r["messages"][-1]["content"].startswith("<answer>") for r in records)
    pool = stage_pool(rl.stages[0], rl)  # RL's problems: only its own families
    assert len(pool) == rl.stages[0].data_size
    assert not any(p.text.startswith(QUESTION_START["gcd"]) for p in pool.values())
    with pytest.raises(DataError, match="synthetic:N"):
        load_records("synthetic:4:0:nope")
    with pytest.raises(ValueError, match="unknown synthetic problem family"):
        stage_pool(Stage(steps=1, data="synthetic:nope"), rl)
