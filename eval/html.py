"""One self-contained HTML file in which every trajectory of a run can be read: per benchmark the scores, per
problem its samples, per sample the question, each turn's reasoning, each code block and its output, the
answer and the verdict. Rendered from the store (see report.write_outputs)."""

from __future__ import annotations

from collections import defaultdict
from html import escape
from typing import Any

CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:2em auto;max-width:1100px;color:#222}
table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}
th{background:#f4f4f4}details{margin:.3em 0 .3em 1em}summary{cursor:pointer}
pre{white-space:pre-wrap;word-break:break-word;padding:.5em;margin:.3em 0;border-radius:4px}
.q{background:#f6f6ff}.r{background:#fafafa}.code{background:#272822;color:#f8f8f2}.out{background:#eef7ee}
.err{background:#fdecea}.ok{color:#1a7f37;font-weight:600}.bad{color:#c62828;font-weight:600}
.meta{color:#666;font-size:12px}
"""


def _pre(text: str, cls: str) -> str:
    return f'<pre class="{cls}">{escape(text)}</pre>'


def _verdict(correct: bool) -> str:
    return '<span class="ok">correct</span>' if correct else '<span class="bad">wrong</span>'


def _turns(traj: dict[str, Any] | None) -> str:
    if not traj:
        return '<p class="meta">no trajectory stored</p>'
    parts = []
    for i, turn in enumerate(traj.get("turns", [])):
        text = turn["text"]
        for call in turn.get("tool_calls", []):
            if call.get("raw"):
                text = text.replace(call["raw"], "")
        parts.append(f'<div class="meta">turn {i + 1} · {turn["num_tokens"]} tokens · {turn["finish_reason"]}</div>')
        if text.strip():
            parts.append(_pre(text.strip(), "r"))
        for call in turn.get("tool_calls", []):
            args = call.get("arguments") or {}
            code = args.get("code") if isinstance(args.get("code"), str) else (call.get("raw") or str(args))
            parts.append(f'<div class="meta">tool call {escape(call["name"])} · {escape(str(call.get("status")))} · '
                         f'{call.get("duration", 0):.2f} s</div>' + _pre(code, "code"))
            if call.get("error"):
                parts.append(_pre(call["error"], "err"))
            parts.append(_pre(call.get("response", ""), "out"))
    if traj.get("error"):
        parts.append(_pre(traj["error"], "err"))
    return "\n".join(parts)


def _sample(s: Any, traj: dict[str, Any] | None) -> str:
    head = (f'#{s.sample_index} {_verdict(s.correct)} · answer <code>{escape(str(s.answer))}</code> · '
            f'{s.tokens} tokens · {s.tool_calls} tool calls · {escape(s.stop_reason)}'
            + (f' · {escape(s.reason)}' if s.reason and not s.correct else ""))
    extra = ""
    details = s.details or {}
    for key in ("expected", "produced", "checked"):  # what was wanted (BFCL) and what was checked (IFEval)
        if key in details:
            extra += f'<div class="meta">{key}</div>' + _pre(str(details[key]), "q")
    if "instructions" in details:  # IFEval: each instruction, strict and loose
        extra += "<table><tr><th>instruction</th><th>strict</th><th>loose</th></tr>" + "".join(
            f"<tr><td>{escape(i['id'])}</td><td>{_verdict(i['strict'])}</td><td>{_verdict(i['loose'])}</td></tr>"
            for i in details["instructions"]) + "</table>"
    for g in details.get("games", []):  # Arena-Hard: the judge's two games
        extra += (f'<div class="meta">game {g["game"]} (the model is assistant {g["model_is"]}): verdict '
                  f'{escape(str(g["verdict"]))}</div>' + _pre(g["judgment"], "out"))
    return f"<details><summary>{head}</summary>{extra}{_turns(traj)}</details>"


def _benchmark_scores(s: dict[str, Any]) -> str:
    """A benchmark's own scores: IFEval's four accuracies and its per-type table, Arena-Hard's win rate."""
    out = ""
    if s.get("ifeval"):
        f = s["ifeval"]
        out += ("<table><tr><th>prompt strict %</th><th>prompt loose %</th><th>instruction strict %</th>"
                f"<th>instruction loose %</th></tr><tr><td>{100 * f['prompt_strict']:.1f}</td>"
                f"<td>{100 * f['prompt_loose']:.1f}</td><td>{100 * f['instruction_strict']:.1f}</td>"
                f"<td>{100 * f['instruction_loose']:.1f}</td></tr></table>"
                "<table><tr><th>instruction</th><th>n</th><th>strict %</th><th>loose %</th></tr>" + "".join(
                    f"<tr><td>{escape(k)}</td><td>{v['n']}</td><td>{100 * v['strict']:.1f}</td>"
                    f"<td>{100 * v['loose']:.1f}</td></tr>" for k, v in f["per_type"].items()) + "</table>")
    a = s.get("arena")
    if a and "score" in a:
        out += (f"<p>Arena-Hard win rate vs {escape(str(a['baseline']))}: <b>{100 * a['score']:.1f}%</b> "
                f"({100 * a['level']:.0f}% bootstrap {100 * a['ci'][0]:.1f}-{100 * a['ci'][1]:.1f}), judge "
                f"{escape(str(a['judge']))}, {a['prompts']} prompts, {a['dropped']} without a verdict</p>")
    return out


def render_html(name: str, results: list[Any], trajectories: dict[int, dict[int, Any]]) -> str:
    body = [f"<h1>rstar2 eval: {escape(name)}</h1>"]
    for r in results:
        s, run = r.summary, r.run
        body.append(f"<h2>{escape(run.benchmark)}</h2><p class='meta'>model {escape(run.model)} · settings "
                    f"{escape(str(run.config))} · version {escape(run.version)} · commit {escape(str(run.git_commit))}"
                    f" · {run.status}</p>")
        if s.get("samples"):
            body.append("<table><tr><th>problems</th><th>samples</th><th>avg@n %</th><th>± s.e.</th><th>95% CI</th>"
                        "<th>maj@n %</th><th>mean tokens</th><th>tool calls</th><th>tool err %</th><th>errors</th>"
                        f"</tr><tr><td>{s['problems']}</td><td>{s['samples']}</td><td>{100 * s['avg']:.1f}</td>"
                        f"<td>{100 * s['stderr']:.1f}</td><td>{100 * s['ci95'][0]:.1f}-{100 * s['ci95'][1]:.1f}</td>"
                        f"<td>{100 * s['maj']:.1f}</td><td>{s['mean_tokens']:.0f}</td>"
                        f"<td>{s['mean_tool_calls']:.2f}</td><td>{100 * s['tool_error_rate']:.1f}</td>"
                        f"<td>{r.errors}</td></tr></table>")
        body.append(_benchmark_scores(s))
        by_problem: dict[str, list[Any]] = defaultdict(list)
        for sample in r.samples:
            by_problem[sample.problem_id].append(sample)
        trajs = trajectories.get(run.id, {})
        for pid, samples in by_problem.items():
            right = sum(x.correct for x in samples)
            question = (samples[0].details or {}).get("question", "")
            body.append(f"<details><summary>problem {escape(pid)} · {right}/{len(samples)} correct · gold "
                        f"<code>{escape(samples[0].gold)}</code></summary>{_pre(question, 'q')}"
                        + "".join(_sample(x, trajs.get(x.id)) for x in samples) + "</details>")
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>rstar2 eval {escape(name)}</title>"
            f"<style>{CSS}</style></head><body>{''.join(body)}</body></html>")
