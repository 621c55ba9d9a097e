"""Isolated Python execution for the agent: a warm local pool, HTTP servers, or Ray actors, one interface."""

from __future__ import annotations

from .pool import LocalSandbox, SandboxConfig
from .types import ExecRequest, ExecResult, Limits, Sandbox, SandboxError, Status

__all__ = ["ExecRequest", "ExecResult", "Limits", "LocalSandbox", "Sandbox", "SandboxConfig", "SandboxError",
           "Status", "make_sandbox"]


def make_sandbox(urls: list[str] | None = None, *, ray_actors: int = 0, ray_address: str | None = None,
                 config: SandboxConfig | None = None) -> Sandbox:
    """The backend a face should use: servers when URLs are given, Ray actors when asked, else local."""
    if urls:
        from .remote import RemoteSandbox

        return RemoteSandbox(urls)
    if ray_actors:
        from .ray_pool import RaySandbox

        return RaySandbox(ray_actors, config, address=ray_address)
    return LocalSandbox(config)
