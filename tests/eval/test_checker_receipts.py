"""Each stored eval result records its checker's receipt (what it is, the official implementation and versions it was
compared with, the agreement: `rstar2 bench conformance`), and `rstar2 eval report` shows it beside the score."""

from __future__ import annotations

from click.testing import CliRunner

from rstar2_agent.cli import main
from rstar2_agent.eval.benchmarks.gpqa_diamond import GPQADiamond
from rstar2_agent.eval.benchmarks.ifeval import IFEval
from rstar2_agent.store import Store


def test_the_receipt_is_stored_with_the_run_and_reported(tmp_path):
    db = str(tmp_path / "r.db")
    store = Store(db)
    for bench in (GPQADiamond(), IFEval()):
        store.open_run("receipts", bench.name, "m", {"n": 1} | bench.settings())
    assert store.runs("receipts")[0].config["checker"]["official"]
    result = CliRunner().invoke(main, ["eval", "report", "receipts", "--db", db], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "against lm-eval 0.4.13" in result.output and "against simple-evals' regex" in result.output


def test_the_bfcl_receipt_names_the_official_package():
    from rstar2_agent.eval.benchmarks.bfcl_v3 import BFCLv3

    assert BFCLv3.checker["official"] == "bfcl-eval 2025.6.8"
