"""The package's imports run one way: the faces (serve, eval, train, chat) use the core (agent, engines, sandbox,
grading, store, chat_format, models, ...), no face imports another, and the core imports no face. Only the
entry point (`rstar2_agent.cli`) and the bench floor (`rstar2_agent.bench`, the benchmarks that measure a
face against its baseline) see every face, and nothing imports the bench but the entry point. Every import
counts, the lazy ones inside functions and the ones written as strings (importlib.import_module, __import__)
too. Inside a wing, no two modules import each other, directly or round a longer circle: the training wing is
layered (config at the bottom; the memory plan, the rollout room, the learner room, the placement chooser above
them; the stage entry points on top), and the walk counts `if TYPE_CHECKING:` imports too, since a circle hidden
behind one is still a circle a reader has to follow."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from conftest import ROOT

# Source folder of each installed package (pyproject's package-dir: the faces keep their top-level folders).
FOLDERS = {"rstar2_agent": ROOT / "rstar2_agent", "rstar2_agent.serve": ROOT / "serve",
           "rstar2_agent.eval": ROOT / "eval", "rstar2_agent.train": ROOT / "train",
           "rstar2_agent.chat": ROOT / "chat", "rstar2_agent.bench": ROOT / "bench"}
FACES = ("rstar2_agent.serve", "rstar2_agent.eval", "rstar2_agent.train", "rstar2_agent.chat")
ENTRY = "rstar2_agent.cli"
BENCH = "rstar2_agent.bench"


def modules() -> dict[str, Path]:
    out = {}
    for package, folder in FOLDERS.items():
        for path in folder.rglob("*.py"):
            parts = path.relative_to(folder).with_suffix("").parts
            if parts[0] in ("serve", "eval", "train", "chat", "bench") and package == "rstar2_agent":
                continue  # not there; the faces live in their own folders
            name = ".".join((package, *parts)).removesuffix(".__init__")
            out[name] = path
    return out


def imports(name: str, source: str, is_package: bool = False) -> list[tuple[int, str]]:
    """(line, absolute module) for every import in a module's source, relative ones resolved."""
    package = name if is_package else name.rsplit(".", 1)[0]
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            found += [(node.lineno, base)]
            found += [(node.lineno, f"{base}.{a.name}") for a in node.names]  # `from pkg import module`
        elif isinstance(node, ast.Call) and _names_import(node.func) and node.args and \
                isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
            found += [(node.lineno, node.args[0].value)]  # importlib.import_module("rstar2_agent.x"), __import__
    return [(line, m) for line, m in found if m.startswith("rstar2_agent")]


def _names_import(func: ast.expr) -> bool:
    name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
    return name in ("import_module", "__import__")


def face_of(module: str) -> str | None:
    return next((f for f in FACES if module == f or module.startswith(f + ".")), None)


def in_bench(module: str) -> bool:
    return module == BENCH or module.startswith(BENCH + ".")


def test_faces_use_the_core_and_never_each_other():
    known = modules()
    assert len(known) > 60 and all(f in known for f in FACES)  # the walk sees the whole package
    wrong: dict[tuple[str, int], str] = {}  # one line per import statement
    for name, path in sorted(known.items()):
        if name == ENTRY or in_bench(name):
            continue
        mine = face_of(name)
        for line, target in imports(name, path.read_text(), path.name == "__init__.py"):
            theirs = face_of(target)
            if theirs is not None and theirs != mine and (target in known or target.rsplit(".", 1)[0] in known):
                layer = f"the face {mine}" if mine else "the core"
                wrong.setdefault((str(path.relative_to(ROOT)), line), f"{layer} imports {target}")
    assert not wrong, "imports that run upward or sideways (move what both need into the core):\n" + "\n".join(
        f"{where}:{line}: {what}" for (where, line), what in sorted(wrong.items()))


def test_nothing_but_the_entry_point_imports_the_bench():
    known = modules()
    assert sum(in_bench(name) for name in known) > 10  # the walk sees the bench folder
    wrong = sorted(f"{known[name].relative_to(ROOT)}:{line}: imports {target}" for name in known
                   if name != ENTRY and not in_bench(name)
                   for line, target in imports(name, known[name].read_text(), known[name].name == "__init__.py")
                   if in_bench(target))
    assert not wrong, "the core and the faces never import the bench:\n" + "\n".join(wrong)


def test_the_walk_sees_lazy_and_relative_imports():
    src = ("def f():\n    from ..train.rl import RLRun\n    import rstar2_agent.serve.app\n"
           "    importlib.import_module('rstar2_agent.serve.protocol')\n    __import__('rstar2_agent.train.roc')\n")
    got = {m for _, m in imports("rstar2_agent.eval.harness", src)}
    assert {"rstar2_agent.train.rl", "rstar2_agent.train.rl.RLRun", "rstar2_agent.serve.app",
            "rstar2_agent.serve.protocol", "rstar2_agent.train.roc"} <= got


def test_the_command_line_loads_a_face_only_to_run_it():
    import subprocess
    import sys

    code = ("import sys, rstar2_agent.cli; top = ('rstar2_agent.serve', 'rstar2_agent.eval', 'rstar2_agent.train', "
            "'rstar2_agent.chat', 'rstar2_agent.bench', 'sqlalchemy', 'fastapi'); "
            "print(sorted(m for m in sys.modules if m in top or m.startswith(tuple(t + '.' for t in top))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout + out.stderr


def graph(prefix: str) -> dict[str, set[str]]:
    """Module -> the modules it imports, among the known modules under `prefix` (a package's import of a name in it,
    `from pkg import name`, counts as an import of the package unless `name` is a module of its own)."""
    known = modules()
    out: dict[str, set[str]] = {}
    for name, path in known.items():
        if name != prefix and not name.startswith(prefix + "."):
            continue
        edges = set()
        for _, target in imports(name, path.read_text(), path.name == "__init__.py"):
            module = target if target in known else target.rsplit(".", 1)[0]
            if module != name and module in known and (module == prefix or module.startswith(prefix + ".")):
                edges.add(module)
        out[name] = edges
    return out


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The import circles of a graph: its strongly connected components of two or more modules (Tarjan's), each as
    one closed path through them."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(_path(sorted(component), edges))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def _path(component: list[str], edges: dict[str, set[str]]) -> list[str]:
    """A shortest way from the component's first module back to itself, through the component."""
    inside, start = set(component), component[0]
    came: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(edges.get(v, set()) & inside):
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(came[path[-1]])
                    return [start, *reversed(path[:-1]), start]
                if w not in came:
                    came[w] = v
                    nxt.append(w)
        frontier = nxt
    return [*component, start]


def test_the_training_wing_has_no_import_circle():
    edges = graph("rstar2_agent.train")
    assert len(edges) > 50 and "rstar2_agent.train.config" in edges  # the walk sees the whole wing
    assert not edges["rstar2_agent.train.config"], "config.py is the wing's bottom: it imports no module of the wing"
    found = circles(edges)
    assert not found, "import circles in the training wing (move what both need below them):\n" + "\n".join(
        " -> ".join(c) for c in found)


@pytest.mark.parametrize("package", ["rstar2_agent.serve", "rstar2_agent.eval", "rstar2_agent"])
def test_the_other_wings_and_the_core_have_no_import_circle(package):
    """serve (its server object below the chat and Responses routes), eval, and the core (the faces' modules left
    out: they have their own tests)."""
    edges = graph(package)
    if package == "rstar2_agent":
        edges = {m: {t for t in ts if face_of(t) is None and not in_bench(t)} for m, ts in edges.items()
                 if face_of(m) is None and not in_bench(m)}
    assert len(edges) > 5
    found = circles(edges)
    assert not found, f"import circles in {package}:\n" + "\n".join(" -> ".join(c) for c in found)


def test_the_circle_walk_finds_a_circle_behind_type_checking_and_a_lazy_import():
    src = {"a": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .b import B\n",
           "b": "def f():\n    from .c import C\n", "c": "from .a import A\n", "d": "from .a import A\n"}
    edges = {f"rstar2_agent.x.{m}": {t for _, t in imports(f"rstar2_agent.x.{m}", code) if t.count(".") == 2}
             for m, code in src.items()}  # the modules each imports (the names imported from them left out)
    assert circles(edges) == [["rstar2_agent.x.a", "rstar2_agent.x.b", "rstar2_agent.x.c", "rstar2_agent.x.a"]]


# Core modules that one face imports today, and why they stay in the core.
ONE_FACE_EXCEPTIONS: dict[str, str] = {}


def test_no_core_module_serves_one_face_only():
    """The core holds what two faces share: a core module that exactly one face imports (directly, or through core
    modules only that face reaches) belongs in that face's wing. The entry point and the bench do not count as faces
    here (the bench measures every face)."""
    known = modules()
    core = {n for n in known if face_of(n) is None and not in_bench(n) and n != ENTRY and n != "rstar2_agent"}
    users: dict[str, set[str]] = {n: set() for n in core}
    for name, path in known.items():
        mine = face_of(name)
        if mine is None:
            continue
        for _, target in imports(name, path.read_text(), path.name == "__init__.py"):
            module = target if target in known else target.rsplit(".", 1)[0]
            if module in users:
                users[module].add(mine)
    core_edges = {n: {t if t in known else t.rsplit(".", 1)[0] for _, t in imports(n, known[n].read_text(),
                                                                                     known[n].name == "__init__.py")}
                  for n in core}
    reached = {n: set(users[n]) for n in core}  # a core module used by a core module inherits that one's faces
    for _ in range(len(core)):
        changed = False
        for n in core:
            for t in core_edges[n]:
                if t in reached and not reached[n] <= reached[t]:
                    reached[t] |= reached[n]
                    changed = True
        if not changed:
            break
    assert reached["rstar2_agent.grading.math"] >= {"rstar2_agent.eval", "rstar2_agent.train"}  # the walk sees uses
    assert all(len(reached[n]) == 1 for n in ONE_FACE_EXCEPTIONS), "an exception no longer needed"
    single = sorted(n for n in core if len(reached[n]) == 1 and n not in ONE_FACE_EXCEPTIONS)
    assert not single, "core modules only one face uses (move them into that face):\n" + "\n".join(
        f"{n}: {sorted(reached[n])[0]}" for n in single)
