"""The `openai` engine: a remote OpenAI-compatible server (vLLM, SGLang, `rstar2 serve`) through
`/v1/completions` with token ids in and token ids out, so the same loop drives a remote model.

Token ids come back in `choices[].token_ids` (`return_token_ids`) or, from servers without it, from
`logprobs.tokens` written as "token_id:N" (`return_tokens_as_token_ids`).
"""

from __future__ import annotations

import json
import re
from typing import Any

import httpx

from .base import Engine, EngineError, Generation, OnTokens, SamplingParams

_CACHE_INFO = re.compile(r'^vllm:cache_config_info\{(?P<labels>[^}]*)\}', re.M)


class OpenAIEngine(Engine):
    name = "openai"

    def __init__(self, url: str, *, model: str | None = None, tokenizer: Any = None, tokenizer_path: str | None = None,
                 api_key: str | None = None, context_length: int | None = None, timeout: float = 600.0,
                 max_connections: int = 256):
        from transformers import AutoTokenizer

        self.base = url.rstrip("/")
        if not self.base.endswith("/v1"):
            self.base += "/v1"
        self.endpoint = self.base
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.client = httpx.AsyncClient(headers=headers, timeout=httpx.Timeout(timeout, connect=10.0),
                                        limits=httpx.Limits(max_connections=max_connections))
        self.served_model = model
        self.model_path = tokenizer_path or model or url
        self.tokenizer = tokenizer or AutoTokenizer.from_pretrained(tokenizer_path or model)
        self.context_length = context_length or 32768
        self._probed = context_length is not None

    async def probe(self) -> None:
        """Fill in the served model name and context length from GET /v1/models, and the KV capacity from a vLLM
        server's /metrics (`vllm:cache_config_info`; left unknown for other servers)."""
        try:
            resp = await self.client.get(f"{self.base}/models")
            resp.raise_for_status()
            models = resp.json().get("data", [])
        except (httpx.HTTPError, ValueError) as e:
            raise EngineError(f"the server at {self.base} did not answer /models ({type(e).__name__}: {e}); is it "
                              "running? Start it (`rstar2 serve`, `vllm serve MODEL`) or fix the URL (--url)") from e
        self._probed = True
        card = next((m for m in models if m.get("id") == self.served_model), models[0] if models else {})
        self.served_model = self.served_model or card.get("id")
        self.context_length = int(card.get("max_model_len") or self.context_length)
        self.kv_capacity = await self._served_kv_capacity()

    async def _served_kv_capacity(self) -> int | None:
        try:
            resp = await self.client.get(self.base.removesuffix("/v1") + "/metrics")
            match = _CACHE_INFO.search(resp.text) if resp.status_code == 200 else None
        except httpx.HTTPError:  # not a vLLM server, or no metrics: unknown
            return None
        if match is None:
            return None
        labels = dict(re.findall(r'(\w+)="([^"]*)"', match.group("labels")))
        try:
            if labels.get("kv_cache_size_tokens", "None").isdigit():
                return int(labels["kv_cache_size_tokens"])
            return int(labels["num_gpu_blocks"]) * int(labels["block_size"])
        except (KeyError, ValueError):
            return None

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams,
                       on_tokens: OnTokens | None = None) -> Generation:
        if sampling.constraint is not None:
            raise EngineError(f"the openai engine (the server at {self.base}) cannot constrain decoding here "
                              '(SamplingParams.constraint: tool_choice "required" or a named function): run the model '
                              'in this process with the vllm engine (--engine vllm), or use tool_choice "auto"')
        if not self._probed:
            await self.probe()
        body: dict[str, Any] = {
            "model": self.served_model, "prompt": list(prompt_ids), "max_tokens": sampling.max_tokens,
            "temperature": sampling.temperature, "top_p": sampling.top_p, "logprobs": 0,
            "return_token_ids": True, "return_tokens_as_token_ids": True, "skip_special_tokens": False,
            "include_stop_str_in_output": True, "stream": on_tokens is not None,
        }
        if sampling.seed is not None:
            body["seed"] = sampling.seed
        if sampling.stop:
            body["stop"] = sampling.stop
        if sampling.stop_token_ids:
            body["stop_token_ids"] = sampling.stop_token_ids
        if sampling.ignore_eos:
            body["ignore_eos"] = True
        try:
            if on_tokens is None:
                resp = await self.client.post(f"{self.base}/completions", json=body)
                _raise_for(resp)
                return _generation([resp.json()["choices"][0]])
            chunks = []
            async with self.client.stream("POST", f"{self.base}/completions", json=body) as resp:
                if resp.status_code != 200:
                    await resp.aread()
                    _raise_for(resp)
                async for line in resp.aiter_lines():
                    if not line.startswith("data:") or line.strip() == "data: [DONE]":
                        continue
                    choice = json.loads(line[5:])["choices"][0]
                    chunks.append(choice)
                    new = _ids(choice)
                    if new:
                        on_tokens(new, _logprobs(choice, len(new)))
            return _generation(chunks)
        except httpx.HTTPError as e:
            raise EngineError(f"the server at {self.base} failed: {type(e).__name__}: {e}") from e

    async def close(self) -> None:
        await self.client.aclose()


def _raise_for(resp: httpx.Response) -> None:
    if resp.status_code != 200:
        raise EngineError(f"the server answered HTTP {resp.status_code}: {resp.text[:500]}")


def _ids(choice: dict[str, Any]) -> list[int]:
    if choice.get("token_ids") is not None:
        return list(choice["token_ids"])
    tokens = (choice.get("logprobs") or {}).get("tokens") or []
    try:
        return [int(t.split(":", 1)[1]) for t in tokens]
    except (IndexError, ValueError) as e:
        raise EngineError("the server returned no token ids: it needs return_token_ids or "
                          "return_tokens_as_token_ids (vLLM, SGLang and rstar2 serve have them)") from e


def _logprobs(choice: dict[str, Any], n: int) -> list[float]:
    lps = (choice.get("logprobs") or {}).get("token_logprobs") or []
    out = [float(x) if x is not None else 0.0 for x in lps][:n]
    return out + [0.0] * (n - len(out))


def _generation(choices: list[dict[str, Any]]) -> Generation:
    ids: list[int] = []
    logprobs: list[float] = []
    finish, stop = None, None
    for c in choices:
        new = _ids(c)
        ids += new
        logprobs += _logprobs(c, len(new))
        finish = c.get("finish_reason") or finish
        stop = c.get("stop_reason") or stop
    finish_reason = "length" if finish == "length" else "stop"
    return Generation(ids, logprobs, finish_reason, stop if isinstance(stop, str) else None)
