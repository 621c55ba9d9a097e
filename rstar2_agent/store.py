"""The project's store (SQLAlchemy): runs, their samples and trajectories, and per-step metrics.

A SQLite file by default ($RSTAR2_HOME/rstar2.db); any SQLAlchemy URL (PostgreSQL) for a shared store.
Every sample is written in one transaction together with its trajectory, so a process killed at any moment
leaves whole samples only; a run is identified by (name, benchmark) and resumed by name.
"""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import (
    JSON,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Integer,
    String,
    Text,
    UniqueConstraint,
    create_engine,
    delete,
    event,
    func,
    select,
)
from sqlalchemy.engine import make_url
from sqlalchemy.exc import IntegrityError, SQLAlchemyError
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from . import __version__
from .chat_format import format_check
from .models import rstar2_home


class StoreError(RuntimeError):
    """The store cannot be opened, or a run cannot be resumed as asked; the message says what to do."""


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC).replace(tzinfo=None)


class Base(DeclarativeBase):
    pass


class Run(Base):
    __tablename__ = "runs"
    __table_args__ = (UniqueConstraint("name", "benchmark"),)
    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(200), index=True)
    benchmark: Mapped[str] = mapped_column(String(100))
    kind: Mapped[str] = mapped_column(String(20), default="eval")  # eval, sft, rl
    model: Mapped[str] = mapped_column(String(500))
    config: Mapped[dict[str, Any]] = mapped_column(JSON)  # the settings results depend on; a resume must match
    info: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)  # the rest (n, engine, data), updated on resume
    version: Mapped[str] = mapped_column(String(50))
    git_commit: Mapped[str | None] = mapped_column(String(64), nullable=True)
    status: Mapped[str] = mapped_column(String(20), default="running")  # running, finished, interrupted
    created_at: Mapped[dt.datetime] = mapped_column(DateTime, default=_now)
    updated_at: Mapped[dt.datetime] = mapped_column(DateTime, default=_now)
    finished_at: Mapped[dt.datetime | None] = mapped_column(DateTime, nullable=True)


class Sample(Base):
    __tablename__ = "samples"
    __table_args__ = (UniqueConstraint("run_id", "problem_id", "sample_index"),)
    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    problem_id: Mapped[str] = mapped_column(String(200))
    sample_index: Mapped[int] = mapped_column(Integer)
    status: Mapped[str] = mapped_column(String(20))  # ok, or error (an engine that kept failing; resume retries)
    correct: Mapped[bool] = mapped_column(Boolean, default=False)
    answer: Mapped[str | None] = mapped_column(Text, nullable=True)
    gold: Mapped[str] = mapped_column(Text)
    reason: Mapped[str | None] = mapped_column(String(200), nullable=True)  # why it is wrong, when known
    stop_reason: Mapped[str] = mapped_column(String(40))
    tokens: Mapped[int] = mapped_column(Integer, default=0)  # generated response tokens
    tool_calls: Mapped[int] = mapped_column(Integer, default=0)
    tool_errors: Mapped[int] = mapped_column(Integer, default=0)
    turns: Mapped[int] = mapped_column(Integer, default=0)
    seconds: Mapped[float] = mapped_column(Float, default=0.0)
    timings: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    details: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    attempts: Mapped[int] = mapped_column(Integer, default=1)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime, default=_now)


class TrajectoryRow(Base):
    __tablename__ = "trajectories"
    sample_id: Mapped[int] = mapped_column(ForeignKey("samples.id", ondelete="CASCADE"), primary_key=True)
    data: Mapped[dict[str, Any]] = mapped_column(JSON)  # Trajectory.to_dict()


class Judgment(Base):
    """A judge's verdict on one game of a sample (Arena-Hard: two per prompt), stored as soon as the judge answers, so a
    resumed run never asks the judge about the same answer twice. Keyed by the judged answer's hash: a regenerated
    answer that differs is a new game."""
    __tablename__ = "judgments"
    __table_args__ = (UniqueConstraint("run_id", "problem_id", "sample_index", "game", "judge", "answer_sha"),)
    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    problem_id: Mapped[str] = mapped_column(String(200))
    sample_index: Mapped[int] = mapped_column(Integer)
    game: Mapped[int] = mapped_column(Integer)
    judge: Mapped[str] = mapped_column(String(500))
    answer_sha: Mapped[str] = mapped_column(String(64))
    verdict: Mapped[str | None] = mapped_column(String(20), nullable=True)  # None: the judge gave no label
    text: Mapped[str] = mapped_column(Text)  # what the judge wrote
    created_at: Mapped[dt.datetime] = mapped_column(DateTime, default=_now)


class Metric(Base):
    __tablename__ = "metrics"
    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    step: Mapped[int] = mapped_column(Integer)
    name: Mapped[str] = mapped_column(String(100))
    value: Mapped[float] = mapped_column(Float)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime, default=_now)


def sample_row(run_id: int, problem_id: str, index: int, traj: Any, *, correct: bool, answer: str | None, gold: str,
               reason: str | None = None, details: dict[str, Any] | None = None, attempts: int = 1) -> Sample:
    """The stored form of one graded trajectory (eval's samples and RL's rollouts alike)."""
    details = dict(details or {})
    details.setdefault("format", format_check(traj))
    return Sample(run_id=run_id, problem_id=problem_id, sample_index=index,
                  status="error" if traj.stop_reason == "engine_error" else "ok", correct=correct, answer=answer,
                  gold=gold, reason=reason, stop_reason=traj.stop_reason, tokens=sum(t.num_tokens for t in traj.turns),
                  tool_calls=len(traj.tool_calls), tool_errors=sum(c.failed for c in traj.tool_calls),
                  turns=len(traj.turns), seconds=traj.timings.get("total", 0.0), timings=dict(traj.timings),
                  details=details, error=traj.error, attempts=attempts)


def default_url() -> str:
    return f"sqlite:///{rstar2_home() / 'rstar2.db'}"


def as_url(db: str | os.PathLike | None) -> str:
    """None -> the default SQLite file; a path -> a SQLite file there; a URL stays."""
    if db is None:
        return default_url()
    db = str(db)
    return db if "://" in db else f"sqlite:///{Path(db).expanduser().resolve()}"


def git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).parent, capture_output=True,
                             text=True, timeout=5)
        return out.stdout.strip() or None if out.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None


class Store:
    def __init__(self, db: str | os.PathLike | None = None):
        self.url = as_url(db)
        try:
            path = _sqlite_file(self.url)
            if path is not None:
                _create_sqlite_file(path)
            self.engine = _connect(self.url)
            Base.metadata.create_all(self.engine)  # a no-op on a file made above; adds tables a newer version has
        except (SQLAlchemyError, ValueError) as e:  # ValueError: a URL SQLAlchemy cannot parse
            raise StoreError(f"cannot open the store {self.url}: {e}; check --db (a file path or a "
                             "SQLAlchemy URL such as postgresql://user@host/db)") from e

    @contextmanager
    def session(self) -> Iterator[Session]:
        with Session(self.engine, expire_on_commit=False) as s, s.begin():
            yield s

    # -- runs
    def open_run(self, name: str, benchmark: str, model: str, config: dict[str, Any],
                 info: dict[str, Any] | None = None, kind: str = "eval") -> Run:
        """Create the run, or resume it when one with this name and benchmark exists with the same settings.
        Two processes opening the same new run at once: one creates it, the other resumes it."""
        try:
            with self.session() as s:
                if s.scalars(select(Run.id).where(Run.name == name, Run.benchmark == benchmark)).first() is None:
                    run = Run(name=name, benchmark=benchmark, kind=kind, model=model, config=config,
                              info=info or {}, version=__version__, git_commit=git_commit())
                    s.add(run)
                    s.flush()
                    return run
        except IntegrityError:  # created by another process between the select and the insert: resume it
            pass
        with self.session() as s:
            run = s.scalars(select(Run).where(Run.name == name, Run.benchmark == benchmark)).one()
            differ = sorted(k for k in {*config, *run.config} if config.get(k) != run.config.get(k))
            if run.model != model or differ:
                changes = [f"model: {run.model!r} -> {model!r}"] if run.model != model else []
                changes += [f"{k}: {run.config.get(k)!r} -> {config.get(k)!r}" for k in differ]
                raise StoreError(f"the run {name!r} ({benchmark}) exists with other settings ({'; '.join(changes)}); "
                                 "resume it with its own settings, or give this one a new --run name")
            run.status, run.updated_at, run.finished_at = "running", _now(), None
            run.info = {**run.info, **(info or {})}
            return run

    def set_status(self, run_id: int, status: str) -> None:
        with self.session() as s:
            run = s.get(Run, run_id)
            run.status, run.updated_at = status, _now()
            if status == "finished":
                run.finished_at = _now()

    def runs(self, name: str | None = None) -> list[Run]:
        with self.session() as s:
            q = select(Run).order_by(Run.created_at, Run.benchmark)
            return list(s.scalars(q.where(Run.name == name) if name else q))

    # -- samples
    def done(self, run_id: int) -> set[tuple[str, int]]:
        """(problem id, sample index) of the samples that finished; error samples are not done."""
        with self.session() as s:
            rows = s.execute(select(Sample.problem_id, Sample.sample_index).where(
                Sample.run_id == run_id, Sample.status == "ok"))
            return {(p, i) for p, i in rows}

    def add_sample(self, sample: Sample, trajectory: dict[str, Any]) -> None:
        """Write a sample and its trajectory in one transaction, replacing an earlier error sample."""
        with self.session() as s:
            old = s.scalars(select(Sample).where(Sample.run_id == sample.run_id, Sample.problem_id ==
                                                 sample.problem_id, Sample.sample_index == sample.sample_index)).first()
            if old is not None:
                sample.attempts = (sample.attempts or 1) + old.attempts
                s.execute(delete(TrajectoryRow).where(TrajectoryRow.sample_id == old.id))
                s.delete(old)
                s.flush()
            s.add(sample)
            s.flush()
            s.add(TrajectoryRow(sample_id=sample.id, data=trajectory))
            s.get(Run, sample.run_id).updated_at = _now()

    def samples(self, run_id: int, status: str | None = None) -> list[Sample]:
        with self.session() as s:
            q = select(Sample).where(Sample.run_id == run_id).order_by(Sample.problem_id, Sample.sample_index)
            return list(s.scalars(q.where(Sample.status == status) if status else q))

    def trajectories(self, run_id: int) -> dict[int, dict[str, Any]]:
        """sample id -> trajectory dict, for one run."""
        with self.session() as s:
            rows = s.execute(select(TrajectoryRow.sample_id, TrajectoryRow.data).join(
                Sample, Sample.id == TrajectoryRow.sample_id).where(Sample.run_id == run_id))
            return {sid: data for sid, data in rows}

    # -- judgments (benchmarks judged by a model)
    def judgment(self, run_id: int, problem_id: str, sample_index: int, game: int, judge: str,
                 answer_sha: str) -> Judgment | None:
        with self.session() as s:
            return s.scalars(select(Judgment).where(
                Judgment.run_id == run_id, Judgment.problem_id == problem_id, Judgment.sample_index == sample_index,
                Judgment.game == game, Judgment.judge == judge, Judgment.answer_sha == answer_sha)).first()

    def add_judgment(self, judgment: Judgment) -> None:
        """Store a judgment; one stored meanwhile for the same game (another process) is kept."""
        try:
            with self.session() as s:
                s.add(judgment)
        except IntegrityError:
            pass

    def judgments(self, run_id: int) -> list[Judgment]:
        with self.session() as s:
            return list(s.scalars(select(Judgment).where(Judgment.run_id == run_id).order_by(
                Judgment.problem_id, Judgment.sample_index, Judgment.game)))

    # -- metrics (training)
    def add_metrics(self, run_id: int, step: int, values: dict[str, float]) -> None:
        """Record a step's metrics, replacing in the same transaction whatever was recorded for that step before
        (a step trained again after a resume), so a step never has two values for one metric."""
        with self.session() as s:
            s.execute(delete(Metric).where(Metric.run_id == run_id, Metric.step == step))
            s.add_all(Metric(run_id=run_id, step=step, name=k, value=float(v)) for k, v in values.items())

    def last_step(self, run_id: int) -> int | None:
        """The highest step a training run has metrics for."""
        with self.session() as s:
            return s.scalar(select(func.max(Metric.step)).where(Metric.run_id == run_id))

    def forget_steps(self, run_id: int, first: int, sample_prefixes: list[str] | tuple[str, ...] = ()) -> None:
        """Delete, in one transaction, the metrics of steps `first` and later and the samples (with their
        trajectories) whose problem id starts with one of `sample_prefixes` (the rollouts of those steps): what a
        killed training run recorded past its last checkpoint, before the resumed run trains those steps again."""
        with self.session() as s:
            for prefix in sample_prefixes:
                # a range on the (run, problem id, index) key's index: the ids that start with the prefix
                end = prefix[:-1] + chr(ord(prefix[-1]) + 1)
                where = (Sample.run_id == run_id, Sample.problem_id >= prefix, Sample.problem_id < end)
                s.execute(delete(TrajectoryRow).where(TrajectoryRow.sample_id.in_(select(Sample.id).where(*where))))
                s.execute(delete(Sample).where(*where))
            s.execute(delete(Metric).where(Metric.run_id == run_id, Metric.step >= first))

    def close(self) -> None:
        self.engine.dispose()


def _connect(url: str):
    engine = create_engine(url)
    if engine.dialect.name == "sqlite":
        event.listen(engine, "connect", _sqlite_pragmas)
    return engine


def _sqlite_file(url: str) -> Path | None:
    """The file of a SQLite URL (query options such as ?timeout=5 are not part of it); None for other databases
    and for SQLite in memory."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:") or \
            parsed.database.startswith("file:"):
        return None
    return Path(parsed.database)


def _create_sqlite_file(path: Path) -> None:
    """Make a new SQLite store appear with its tables already in it: the schema is written to a file beside it,
    which is then linked into place (atomic; when another process made the file first, theirs is kept). So no
    reader that sees the file (a report, a test polling a running eval) ever finds it without tables."""
    if path.exists():
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.new")
    engine = _connect(f"sqlite:///{tmp}")
    try:
        Base.metadata.create_all(engine)
        engine.dispose()  # closes the file and folds its WAL back in
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass
        except OSError:  # a filesystem without hard links: rename, unless the file appeared meanwhile
            if not path.exists():
                os.replace(tmp, path)
    finally:
        engine.dispose()
        for leftover in (tmp, Path(f"{tmp}-wal"), Path(f"{tmp}-shm")):
            leftover.unlink(missing_ok=True)


def _sqlite_pragmas(conn, _record) -> None:
    cur = conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")  # readers (reports) do not block the writer
    cur.execute("PRAGMA synchronous=NORMAL")  # a committed sample survives a killed process
    cur.execute("PRAGMA busy_timeout=30000")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.close()
