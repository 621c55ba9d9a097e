"""The SQLite store appears with its schema: a reader that sees the file never finds it without tables (a
test once polled a running eval's database between its creation and its CREATE TABLEs)."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys

from rstar2_agent import store as store_module
from rstar2_agent.store import Store

from conftest import ROOT


def _tables(path) -> set[str]:
    with sqlite3.connect(path) as conn:
        return {r[0] for r in conn.execute("select name from sqlite_master where type = 'table'")}


def test_the_file_appears_with_its_tables(tmp_path, monkeypatch):
    db = tmp_path / "sub" / "eval.db"
    seen_at_appearance: list[set[str]] = []
    real_link = os.link

    def link_and_look(src, dst, *a, **kw):  # the moment the file becomes visible under its name
        real_link(src, dst, *a, **kw)
        seen_at_appearance.append(_tables(dst))

    monkeypatch.setattr(store_module.os, "link", link_and_look)
    Store(db)
    assert seen_at_appearance == [{"runs", "samples", "trajectories", "judgments", "metrics"}]
    assert [p.name for p in db.parent.iterdir() if not p.name.startswith("eval.db-")] == ["eval.db"]  # no staging file


def test_processes_opening_one_new_store_at_once_all_succeed(tmp_path):
    db = tmp_path / "shared.db"
    code = (f"import sys; sys.path.insert(0, {str(ROOT)!r}); from rstar2_agent.store import Store; "
            "s = Store(sys.argv[1]); s.open_run('r' + sys.argv[2], 'b', 'm', {})")
    procs = [subprocess.Popen([sys.executable, "-c", code, str(db), str(i)], stderr=subprocess.PIPE, text=True)
             for i in range(6)]
    errors = [p.communicate(timeout=120)[1] for p in procs]
    assert all(p.returncode == 0 for p in procs), errors
    with sqlite3.connect(db) as conn:
        assert conn.execute("select count(*) from runs").fetchone()[0] == 6
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith("shared.db-")) == ["shared.db"]


def test_sqlite_urls_with_options_or_in_memory_open_as_sqlalchemy_reads_them(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    mem = Store("sqlite:///:memory:")
    run = mem.open_run("r", "b", "m", {"n": 1})
    assert mem.open_run("r", "b", "m", {"n": 1}).id == run.id
    mem.close()
    opts = Store(f"sqlite:///{tmp_path / 'x.db'}?timeout=5")
    opts.open_run("r", "b", "m", {})
    opts.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.db"]  # no file named ':memory:' or 'x.db?timeout=5'


def test_threads_opening_one_new_store_at_once_all_succeed(tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    def open_one(_):
        s = Store(tmp_path / "t.db")
        s.open_run("r", "b", "m", {})
        s.close()

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(open_one, range(8)))
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith("t.db-")) == ["t.db"]
