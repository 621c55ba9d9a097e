"""`rstar2 train report RUN`: the default table shows the few columns a step is read by and fits a terminal;
`--all` shows every metric the run logged. (`--json` is tested in test_train_logprobs.py.)"""

from __future__ import annotations

import pytest
from click.testing import CliRunner

# every metric an RL step logs (train/rl.py `learn` and `run_rl`, the update's and the optimizer's)
RL_METRICS = (
    "accuracy", "response_tokens", "turns", "tool_calls", "tool_error_ratio_positive", "tool_error_ratio_kept_positive",
    "positive_with_tool_error", "engine_errors", "format_violations", "time_rollout", "time_grading",
    "rollout_wait_s", "time_update", "time_push", "push_wait_s", "rollout_tokens_per_s", "policy_lag_max",
    "policy_lag_mean", "stale_groups_dropped", "roc_dropped_groups", "roc_kept_positive", "roc_kept_negative",
    "loss", "entropy", "clip_frac", "logprob_gap", "logp_mismatch_kl", "logp_mismatch_out_of_range",
    "logp_mismatch_abs", "grad_norm", "lr", "update_tokens", "stage", "learner_wait_s", "step_time")
SFT_METRICS = ("loss", "tokens_per_s", "target_tokens", "grad_norm", "lr")


@pytest.fixture
def db(tmp_path):
    from rstar2_agent.store import Store

    path = str(tmp_path / "store.db")
    store = Store(path)
    rl = store.open_run("rl-x", "rl", "m", {}, {}, kind="rl")
    sft = store.open_run("sft-x", "sft", "m", {}, {}, kind="sft")
    for step in (1, 2, 3):
        store.add_metrics(rl.id, step, {n: 1234.5678 + i / 7 + step for i, n in enumerate(RL_METRICS)})
        store.add_metrics(sft.id, step, {n: 0.000123456 * (i + 1) for i, n in enumerate(SFT_METRICS)})
    return path


def report(db, *args):
    from rstar2_agent.cli import main

    result = CliRunner().invoke(main, ["train", "report", *args, "--db", db], env={"COLUMNS": "120"})
    assert result.exit_code == 0, result.output
    return result.stdout


def headers(out: str) -> list[str]:
    """The table's column headers, each put together from the lines rich wrapped it over."""
    lines = out.splitlines()
    top = next(i for i, line in enumerate(lines) if line.startswith("┏"))
    below = next(i for i, line in enumerate(lines) if line.startswith("┡"))
    cells = [line.split("┃")[1:-1] for line in lines[top + 1:below]]
    return [" ".join(" ".join(parts).split()) for parts in zip(*cells, strict=True)]


def test_report_default_shows_the_short_columns_and_fits_a_terminal(db):
    out = report(db, "rl-x")
    assert headers(out) == ["step", "accuracy", "tool errors", "resp tokens", "loss", "mismatch", "step s"]
    assert max(len(line) for line in out.splitlines()) <= 120
    assert "mismatch: logp_mismatch_kl" in out and "tool errors: tool_error_ratio_positive" in out
    assert f"{len(RL_METRICS) - 6} more metrics with --all" in " ".join(out.split())
    assert [line.split("│")[1].strip() for line in out.splitlines() if line.startswith("│")] == ["1", "2", "3"]

    sft = report(db, "sft-x")
    assert headers(sft) == ["step", "loss", "grad norm", "lr", "tokens/s"]
    assert max(len(line) for line in sft.splitlines()) <= 120


def test_report_all_has_every_metric(db):
    out = report(db, "rl-x", "--all")
    assert headers(out) == ["step", *(n.replace("_", " ") for n in sorted(RL_METRICS))]
    rows = [line for line in out.splitlines() if line.startswith("│")]
    assert len(rows) == 3 and all(line.count("│") == len(RL_METRICS) + 2 for line in rows)
    assert "more metrics" not in out

    assert headers(report(db, "sft-x", "--all")) == ["step", *(n.replace("_", " ") for n in sorted(SFT_METRICS))]
