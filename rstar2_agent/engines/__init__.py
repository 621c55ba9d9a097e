"""Inference engines behind one async interface (see base.py): vllm (in-process), openai (remote), hf."""

from __future__ import annotations

from .base import Engine, EngineError, Generation, SamplingParams

__all__ = ["ENGINES", "Engine", "EngineError", "Generation", "SamplingParams", "make_engine", "make_engines"]
ENGINES = ("vllm", "hf", "openai")


def make_engine(kind: str, model_path: str, *, context_length: int, url: str | None = None,
                served_model: str | None = None, api_key: str | None = None, build: type[Engine] | None = None,
                **kwargs) -> Engine:
    """Build an engine; `model_path` is the local folder (for openai: where the tokenizer comes from). `build`: the
    class to build for hf or vllm, a subclass of the core's (training's trainable engines, train/rollout)."""
    if kind == "hf":
        from .hf import HFEngine

        return (build or HFEngine)(model_path, context_length=context_length, **kwargs)
    if kind == "vllm":
        from .vllm import VLLMEngine

        return (build or VLLMEngine)(model_path, context_length=context_length, **kwargs)
    if kind == "openai":
        if not url:
            raise EngineError("the openai engine needs --url http://host:port (an OpenAI-compatible server)")
        from .openai import OpenAIEngine

        return OpenAIEngine(url, model=served_model, tokenizer_path=model_path, api_key=api_key)
    raise EngineError(f"unknown engine {kind!r}; choose one of {', '.join(ENGINES)}")


def make_engines(kind: str, model_path: str, *, context_length: int, urls: tuple[str, ...] | list[str] = (),
                 replicas: int = 1, replica_policy: str = "kv_aware", max_response_tokens: int | None = None,
                 served_model: str | None = None, api_key: str | None = None, **kwargs) -> Engine:
    """One engine, or a ReplicaPool (replicas.py) over one engine per `urls` server or `replicas` local engines:
    each trajectory stays on one replica, placed by `replica_policy`. Local replicas suit CPU engines; on GPUs
    run one server per GPU and pass their URLs (or train with `distributed: ray`)."""
    targets: list[str | None] = list(urls) or [None] * replicas
    engines = [make_engine(kind, model_path, context_length=context_length, url=url, served_model=served_model,
                           api_key=api_key, **kwargs) for url in targets]
    if len(engines) == 1:
        return engines[0]
    from .replicas import ReplicaPool

    return ReplicaPool(engines, replica_policy, max_response_tokens=max_response_tokens)
