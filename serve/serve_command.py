"""`rstar2 serve` (its benchmark against vLLM's own server: `rstar2 bench serve`)."""

from __future__ import annotations

import asyncio
import os

import click

from rstar2_agent.chat_format import FORMATS
from rstar2_agent.cli_options import engine_option, repetition_option, replica_options


@click.group("serve", invoke_without_command=True)
@click.pass_context
@click.option("--model", default=None, help="Registry name (default smollm2-agent: the embedded SmolLM2 after the "
              "project's SFT, made on first use; smollm2-135m: the untaught base), local folder or Hugging Face id.")
@engine_option
@click.option("--url", "urls", multiple=True, help="Upstream OpenAI-compatible server for --engine openai; "
              "several: a replica pool over them.")
@replica_options
@click.option("--served-model", default=None, help="The model's name on the upstream server.")
@click.option("--served-model-name", default=None, help="The name clients use (default: the model's).")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8000, show_default=True, type=int)
@click.option("--api-key", envvar="RSTAR2_API_KEY", default=None, help="Require `Authorization: Bearer KEY` on every "
              "path (one key is one tenant: docs/serve.md).")
@click.option("--public-health", is_flag=True, help="With --api-key: /health answers without the key.")
@click.option("--public-metrics", is_flag=True, help="With --api-key: /metrics answers without the key.")
@click.option("--sandbox", "sandbox_urls", multiple=True, help="`rstar2 sandbox serve` URL(s); default: local pool.")
@click.option("--sandbox-workers", type=click.IntRange(1), default=None, help="Local pool workers per template.")
@click.option("--max-concurrency", type=click.IntRange(1), default=64, show_default=True)
@click.option("--max-concurrency-per-client", type=click.IntRange(1), default=None,
              help="Slots of --max-concurrency one client's (address's) tool loops hold at once; its others wait "
              "their turn. Default: a quarter.")
@click.option("--tool-seconds-per-client", type=click.FloatRange(min=0), default=600.0, show_default=True,
              help="Sandbox wall seconds one client may spend a minute (past it: 429, and calls refused); 0: no "
              "budget.")
@click.option("--max-body-mb", type=click.FloatRange(min=0, min_open=True), default=8.0, show_default=True,
              help="Refuse a larger request body with 413 (while it is read).")
@click.option("--header-timeout", type=click.FloatRange(min=0, min_open=True), default=10.0, show_default=True,
              help="Seconds a connection has to send a request's headers (then 408, closed).")
@click.option("--body-timeout", type=click.FloatRange(min=0, min_open=True), default=60.0, show_default=True,
              help="Seconds a request has to send its body once its headers are in (then 408, closed).")
@click.option("--max-connections-per-client", type=click.IntRange(1), default=256, show_default=True,
              help="Connections open at once from one address.")
@click.option("--forwarded-allow-ips", default=None, help="Reverse proxies (comma-separated addresses) whose "
              "X-Forwarded-For names the client the budgets count; default: none (the peer address counts).")
@click.option("--max-turns", type=click.IntRange(1), default=30, show_default=True,
              help="The default and the most a request's max_turns may ask for.")
@click.option("--max-tokens", type=click.IntRange(1), default=8192, show_default=True,
              help="Default response budget when a request sets none.")
@click.option("--temperature", type=click.FloatRange(0, 2), default=None,
              help="The sampling temperature of a request that sets none. Default: the model's: 0 (greedy) for "
              "smollm2-agent, 0.6 for the others.")
@click.option("--tool-timeout", type=click.FloatRange(min=0, min_open=True), default=10.0, show_default=True,
              help="A tool call's default wall-time limit.")
@click.option("--max-tool-timeout", type=click.FloatRange(min=0, min_open=True), default=60.0, show_default=True,
              help="The most a request's tool_timeout may ask for.")
@click.option("--stall-timeout", type=click.FloatRange(min=0), default=300.0, show_default=True,
              help="Abort a request that gets no new token for this many seconds (an error to its client, counted "
              "in /metrics; /health answers 503 while the engine makes no progress). 0: never.")
@repetition_option
@click.option("--format", "format_name", type=click.Choice(FORMATS), default=None,
              help="For the server-side tool loop; default: the model's.")
@click.option("--raw-reasoning", is_flag=True, help="Keep the model's reasoning in `content` as it wrote it (no "
              "`reasoning_content`); a request's `separate_reasoning` still decides for itself.")
@click.option("--forced-call-text-tokens", type=click.IntRange(0), default=0, show_default=True,
              help='tool_choice "required"/named: tokens of free text (reasoning) before the forced call (0: the '
              "call comes first, as vLLM).")
@click.option("--max-containers", type=click.IntRange(1), default=16, show_default=True,
              help="/v1/responses: code_interpreter containers (sandbox sessions) open at once.")
@click.option("--container-idle-timeout", type=click.FloatRange(min=1), default=1200.0, show_default=True,
              help="/v1/responses: seconds an unused container lives.")
@click.option("--max-stored-responses", type=click.IntRange(1), default=1000, show_default=True,
              help="/v1/responses kept for previous_response_id and GET (least recently used out).")
@click.option("--max-stored-mb", type=click.FloatRange(min=0, min_open=True), default=256.0, show_default=True,
              help="... and at most this many MiB of them (their JSON).")
@click.option("--unsafe-no-isolation", "unsafe", is_flag=True, help="Run tool code without bubblewrap.")
def serve_cmd(ctx, model, engine, urls, replicas, replica_policy, served_model, served_model_name, host, port, api_key,
              public_health, public_metrics, sandbox_urls, sandbox_workers, max_concurrency,
              max_concurrency_per_client, tool_seconds_per_client, max_body_mb, header_timeout, body_timeout,
              max_connections_per_client, forwarded_allow_ips, max_turns, max_tokens, temperature, tool_timeout,
              max_tool_timeout, stall_timeout, repetition, format_name, raw_reasoning, forced_call_text_tokens,
              max_containers, container_idle_timeout, max_stored_responses, max_stored_mb, unsafe) -> None:
    """Serve the agent as an OpenAI-compatible API that runs the Python tool itself (`rstar2 bench serve`: against
    vLLM's own server)."""
    if ctx.invoked_subcommand is not None:
        return
    import uvicorn

    from rstar2_agent.engines import EngineError
    from rstar2_agent.engines.spec import EngineSpec
    from rstar2_agent.models import DEFAULT_AGENT, ModelError, default_temperature, resolve_model
    from rstar2_agent.sandbox import SandboxConfig, make_sandbox

    from .app import create_app
    from .guard import uvicorn_config
    from .server import ServeConfig, Server

    model = model or (None if urls else DEFAULT_AGENT)  # the project's agent, made on first use
    check_port(host, port)  # before the model loads: a port already taken is said at once
    try:
        resolved = resolve_model(model)
    except ModelError as e:
        raise click.ClickException(str(e)) from e
    spec = EngineSpec(model=model, engine=engine, urls=urls, replicas=replicas, replica_policy=replica_policy,
                      served_model=served_model, max_tokens=max_tokens)
    kind = spec.kind()
    config = SandboxConfig(isolation=not unsafe)
    if sandbox_workers:
        config.workers = sandbox_workers
    name = served_model_name or (model if model and not os.path.isdir(model) else resolved.spec.name)
    cfg = ServeConfig(model_name=os.path.basename(name.rstrip("/")) if os.path.isdir(name) else name,
                      format=format_name or resolved.spec.format,
                      chat_template=resolved.spec.chat_template, max_turns=max_turns, max_tokens=max_tokens,
                      temperature=default_temperature(model) if temperature is None else temperature,
                      tool_timeout=tool_timeout, max_concurrency=max_concurrency, api_key=api_key,
                      stall_timeout=stall_timeout or None, separate_reasoning=not raw_reasoning,
                      forced_call_text_tokens=forced_call_text_tokens, max_containers=max_containers,
                      container_idle_timeout=container_idle_timeout, max_stored_responses=max_stored_responses,
                      max_stored_mb=max_stored_mb, max_tool_timeout=max_tool_timeout, public_health=public_health,
                      public_metrics=public_metrics, max_concurrency_per_client=max_concurrency_per_client,
                      tool_seconds_per_client=tool_seconds_per_client, max_body_mb=max_body_mb,
                      header_timeout=header_timeout, body_timeout=body_timeout,
                      max_connections_per_client=max_connections_per_client,
                      forwarded_allow_ips=forwarded_allow_ips, repetition=repetition)

    async def main() -> None:  # the engine is built inside the loop the server runs on (vLLM binds to it)
        try:
            eng = spec.make(resolved)
        except EngineError as e:
            raise click.ClickException(str(e)) from e
        app = create_app(Server(eng, make_sandbox(list(sandbox_urls), config=config), cfg))
        pool = f" x {len(urls) or replicas} ({replica_policy})" if len(urls) > 1 or replicas > 1 else ""
        click.echo(f"rstar2 serve: {cfg.model_name} on {kind}{pool}, http://{host}:{port}/v1 (a request that sets no "
                   f"temperature samples at {cfg.temperature:g})", err=True)
        await uvicorn.Server(uvicorn_config(app, host, port, cfg)).serve()

    asyncio.run(main())


def check_port(host: str, port: int) -> None:
    """Fail, saying what to do, where `host:port` cannot be listened on (uvicorn would find out only after the
    model has loaded, and end with a line of its log)."""
    import socket

    try:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds: a port in TIME_WAIT is free
            s.bind((host, port))
    except OSError as e:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            free = s.getsockname()[1]
        raise click.ClickException(f"cannot listen on {host}:{port} ({e.strerror or e}): another server (an "
                                   f"earlier `rstar2 serve`?) holds it; stop it, or pick another port: --port {free}"
                                   ) from None
