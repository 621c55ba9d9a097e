"""`rstar2 sandbox run|serve|check` (its benchmark: `rstar2 bench sandbox`)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import sys

import click

from .pool import LocalSandbox, SandboxConfig
from .types import Limits, Sandbox, SandboxError


def _config(workers: int | None, unsafe: bool, **kw) -> SandboxConfig:
    cfg = SandboxConfig(isolation=not unsafe, **{k: v for k, v in kw.items() if v is not None})
    if workers:
        cfg.workers = workers
    return cfg


unsafe_option = click.option("--unsafe-no-isolation", "unsafe", is_flag=True,
                             help="Run code without bubblewrap isolation (only where untrusted code is acceptable).")
workers_option = click.option("--workers", type=click.IntRange(1), default=None,
                              help="Warm worker processes (default: one per CPU).")


@click.group("sandbox")
def sandbox_group() -> None:
    """The isolated Python sandbox the agent's tool runs in."""


@sandbox_group.command("run")
@click.argument("file", type=click.File("r"), default="-")
@click.option("--json", "as_json", is_flag=True, help="Print the whole result record as JSON.")
@click.option("--stdin", "stdin_text", default="", help="Text given to the program on standard input.")
@click.option("--timeout", type=click.FloatRange(min=0, min_open=True), default=None, help="Wall-time limit, s.")
@click.option("--url", "urls", multiple=True, help="Run on a `rstar2 sandbox serve` server instead of locally.")
@unsafe_option
def run_cmd(file, as_json: bool, stdin_text: str, timeout: float | None, urls: tuple[str, ...],
            unsafe: bool) -> None:
    """Run one program (FILE, or - for standard input) and print its result."""
    code = file.read()

    async def go():
        sandbox: Sandbox
        if urls:
            from .remote import RemoteSandbox

            sandbox = RemoteSandbox(list(urls))
        else:
            sandbox = LocalSandbox(SandboxConfig(workers=1, isolation=not unsafe, templates=((),)))
        async with sandbox:
            return await sandbox.run(code, stdin=stdin_text, timeout=timeout)

    try:
        result = asyncio.run(go())
    except SandboxError as e:
        raise click.ClickException(str(e)) from e
    if as_json:
        click.echo(json.dumps(result.to_dict(), indent=2))
    else:
        sys.stdout.write(result.stdout)
        sys.stderr.write(result.stderr)
        if not result.ok:
            click.echo(f"[{result.status}]", err=True)
    sys.exit(0 if result.ok else (result.exit_code or 1))


@sandbox_group.command("check")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@unsafe_option
def check_cmd(as_json: bool, unsafe: bool) -> None:
    """Start one worker and say which isolation it got: host uid, namespaces, cgroup, /proc/sys, seccomp."""
    from .check import isolation_report, render

    cfg = _config(1, unsafe)
    try:
        report = asyncio.run(isolation_report(cfg))
    except SandboxError as e:
        raise click.ClickException(f"the sandbox refuses to start here: {e}") from e
    click.echo(json.dumps(report, indent=2) if as_json else render(report, cfg))
    sys.exit(1 if report["problems"] else 0)


@sandbox_group.command("serve")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8100, show_default=True, type=int)
@workers_option
@click.option("--max-queue", type=click.IntRange(1), default=None, help="Calls that may wait for a worker.")
@click.option("--queue-timeout", type=float, default=None, help="Seconds a call may wait for a worker.")
@click.option("--max-sessions", type=click.IntRange(0), default=None, help="Open stateful sessions at most.")
@click.option("--timeout", "wall", type=float, default=None, help="Default per-call wall-time limit, s.")
@click.option("--memory-mb", type=click.IntRange(64), default=None, help="Per-call address-space limit, MiB.")
@unsafe_option
def serve_cmd(host: str, port: int, workers: int | None, max_queue, queue_timeout, max_sessions, wall,
              memory_mb, unsafe: bool) -> None:
    """Serve the sandbox over HTTP (POST /run, /run_batch, /sessions; GET /health, /metrics)."""
    import uvicorn

    from .server import create_app

    limits = Limits()
    if wall:
        limits = dataclasses.replace(limits, wall_seconds=wall, cpu_seconds=max(wall, limits.cpu_seconds or 0))
    if memory_mb:
        limits = dataclasses.replace(limits, memory_bytes=memory_mb << 20)
    cfg = _config(workers, unsafe, limits=limits, max_queue=max_queue, queue_timeout=queue_timeout,
                  max_sessions=max_sessions)
    sandbox = LocalSandbox(cfg)
    try:
        uvicorn.run(create_app(sandbox), host=host, port=port, log_level="warning")
    except SandboxError as e:
        raise click.ClickException(str(e)) from e


