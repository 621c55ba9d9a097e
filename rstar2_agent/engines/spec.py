"""Which engine a face runs, and how it is built: one spec and one builder for chat, serve and eval, with the
`--engine` choices declared once (cli_options.engine_option). Training builds its rollout engines itself
(train/rl.py), because they are tied to the learner: the hf engine runs the learner's own model object, the
in-process vLLM engine and Ray's engine actors take its weights after every update."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..chat_format import ChatFormat
from ..models import ResolvedModel, resolve_model
from . import Engine, make_engines


@dataclass
class EngineSpec:
    model: str | None = None  # registry name, folder or hub id (with urls: where the tokenizer comes from)
    engine: str = "auto"  # vllm on GPU machines, hf on CPU, openai with urls
    urls: Sequence[str] = ()  # OpenAI-compatible servers (several: a replica pool over them)
    replicas: int = 1  # local engines behind one replica pool
    replica_policy: str = "kv_aware"
    served_model: str | None = None
    api_key: str | None = None
    format: str | None = None  # default: the model's, from the registry
    max_tokens: int = 4096  # the response budget (a replica pool plans its KV reservations with it)

    def kind(self) -> str:
        if self.urls:
            return "openai"
        if self.engine != "auto":
            return self.engine
        from ..devices import on_gpu  # not torch.cuda.is_available(): it would break vLLM's fork of its engine core

        return "vllm" if on_gpu() else "hf"

    def make(self, resolved: ResolvedModel) -> Engine:
        """The engine, or a replica pool over several (build it inside the event loop that will use it)."""
        return make_engines(self.kind(), resolved.path, context_length=resolved.spec.context_length,
                            urls=tuple(self.urls), replicas=self.replicas, replica_policy=self.replica_policy,
                            max_response_tokens=self.max_tokens, served_model=self.served_model,
                            api_key=self.api_key)

    def chat_format(self, engine: Engine, resolved: ResolvedModel) -> ChatFormat:
        return ChatFormat(engine.tokenizer, self.format or resolved.spec.format,
                          resolved.spec.chat_template)


def build(spec: EngineSpec, on_status: Callable[[str], None] = lambda message: None) -> tuple[Engine, ChatFormat]:
    """Resolve the model, start the engine(s), and the chat format the model is prompted with."""
    on_status(f"resolving the model {spec.model or 'smollm2-135m'} ...")
    resolved = resolve_model(spec.model)
    on_status(f"starting the {spec.kind()} engine on {resolved.path} ...")
    engine = spec.make(resolved)
    return engine, spec.chat_format(engine, resolved)
