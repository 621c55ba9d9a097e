"""bench/gpu_check.py, the script a session lent a GPU runs, stays runnable: its tiny CPU mode goes through the
same learner, engine and parity code (no GPU here, so the GPU figures themselves are not checked)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_gpu_check_runs_end_to_end_in_tiny_cpu_mode(tmp_path):
    out = tmp_path / "gpu.json"
    p = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_check.py"), "--device", "cpu", "--tiny",
                        "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    report = json.loads(out.read_text())
    assert not report.get("errors"), report.get("errors")
    assert report["learner"]["tokens_per_s"] > 0 and report["generation"]["tokens_per_s"] > 0
    assert report["parity"]
    assert report["sdpa"]["64"] and report["fork"] == {"skipped": "no CUDA device"}
    fsdp = report["fsdp"]  # one gloo rank through FSDP2: the update and the full-state gather ran
    assert fsdp["backend"] == "gloo" and fsdp["gathered_tensors"] > 0 and fsdp["gathered_on"] == ["cpu"]
    ipc = report["push_ipc"]  # CUDA IPC across two processes, by the CPU stand-in here (a GPU measures memory)
    assert ipc["substituted"] and ipc["unpacked"]["checksums_agree"] and ipc["packed"]["checksums_agree"]
    assert ipc["packed"]["chunks"] == 2  # 32 MB of weights through a 16 MB buffer
    probe = report["push_probe"]  # the learner's bf16 against fp32 scores: the gap a run calibrates on
    assert probe["tokens_64"]["max_abs_diff"] > 0 and probe["tokens_64"]["calibrated_bound"] >= 1e-3
    memory = report["memory"]  # the memory probe against the plan, at 2 and 4 layers, with and without checkpointing
    assert len(memory["runs"]) == 8 and all(r["measured_gib"] >= 0 and r["estimate_gib"] > 0 for r in memory["runs"])
    assert len(memory["slopes"]) == 4
    colocated = report["colocated"]  # two colocated steps: the placement's calls, each phase measured, the probe
    assert colocated["calls"] == ["sleep(1)", "release", "wake(weights)", "push", "release",
                                  "wake(kv_cache)"] * 2
    assert colocated["probe_ok"] and all(s["update_peak_gib"] > 0 and s["plan_update_gib"] > 0
                                         and s["learner_tokens_per_s"] > 0 for s in colocated["steps"])


def test_a_misspelled_part_to_skip_is_refused_naming_the_parts(capsys):
    """`--skip pushipc` would otherwise run the part it meant to leave out, unnoticed."""
    from rstar2_agent.bench.gpu_check import PARTS, parse

    assert parse(["--skip", "learner, push_ipc"]).skip == "learner, push_ipc"
    with pytest.raises(SystemExit) as e:
        parse(["--skip", "learner,pushipc"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "no part named pushipc" in err and all(p in err for p in PARTS)
