"""The planner LLM behind Ray Serve, as an OpenAI-compatible ``/v1/chat/completions`` endpoint.

**Here (CPU, offline).** ``start_local_llm`` deploys ``OpenAIChatServer``, a Serve deployment
wrapping the local chat model (SmolLM2-135M-Instruct GGUF, ``planners.chat.LocalChatModel``;
any ``ChatModel`` factory in tests), on the HTTP proxy at ``llm.serve.host:port`` (127.0.0.1 by
default: loopback only) and returns the base URL. Planners reach it with the ``openai`` backend::

    import ray; ray.init()
    from trajrag import config
    from trajrag.distributed.serve_llm import start_local_llm, shutdown
    llm = config.settings().llm             # with overrides: config.settings(["llm.serve.port=8001"])
    url = start_local_llm(llm)              # http://127.0.0.1:8000/v1, model "smollm2-135m-instruct"
    # trajrag eval ... --set llm.chat.backend=openai --set llm.chat.base_url=$url \
    #                  --set llm.chat.model=smollm2-135m-instruct
    shutdown(llm.serve.app_name)

or from a shell: ``python -m trajrag.distributed.serve_llm [--set llm.serve.port=8001]``
(blocks until Ctrl-C). The endpoint implements the request fields the planner sends: ``model``,
``messages``, ``max_tokens`` / ``max_completion_tokens`` and vLLM's pre-fill extension
(``continue_final_message: true`` with a final assistant message); ``temperature`` and other
sampling fields are accepted and ignored (the local model decodes greedily); no streaming.
One replica generates one answer at a time; ``max_ongoing_requests`` bounds its queue.

**On a GPU cluster.** The paper's planner, Qwen3-32B, runs on vLLM through Ray Serve LLM
(``ray.serve.llm.build_openai_app``, same OpenAI API). ``configs/serve_llm_gpu.yaml`` is a Serve
config file for it (GPU image: ``ray[serve,llm]==2.60.*``, which brings the vLLM it supports)::

    serve run configs/serve_llm_gpu.yaml                   # foreground, on the head node
    serve deploy configs/serve_llm_gpu.yaml -a http://HEAD:8265   # onto a running cluster
    serve status                                           # wait for RUNNING (weights load: minutes)

then point the planner at it with ``--set llm.chat.backend=openai --set
llm.chat.base_url=http://HEAD:8000/v1 --set llm.chat.model=qwen3-32b``, HEAD being the head's
address inside the cluster (``trajrag-head-svc`` on KubeRay). The file runs one proxy, on the head
(``proxy_location: HeadOnly``), listening on the cluster-internal network: an ``EveryNode`` proxy
runs only on nodes that hold a replica, which evaluators on the CPU nodes could not reach on their
own loopback. Never expose port 8000 outside the cluster.
"""

from __future__ import annotations

import asyncio
import functools
import time
import urllib.error
import urllib.request
import uuid
from typing import Any, Callable, Optional, Sequence

from trajrag import config
from trajrag.planners.chat import ChatError, ChatModel, make_local_chat
from trajrag.planners.llm import LLMConfig

DEFAULT_MAX_TOKENS = 256  # when a request names none (OpenAI leaves it to the server)


class ChatRequestError(ValueError):
    """A chat-completions request the server cannot take (HTTP 400 / 404)."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


def parse_chat_request(body: Any, model_id: str) -> tuple[list[dict], str, int]:
    """``(messages, prefill, max_tokens)`` from an OpenAI chat-completions body.

    With ``continue_final_message`` the final assistant message is the prefill (vLLM's
    extension); ``model`` must be ``model_id`` (or absent).
    """
    if not isinstance(body, dict):
        raise ChatRequestError("the request body must be a JSON object")
    if body.get("model") not in (None, "", model_id):
        raise ChatRequestError(f"model {body.get('model')!r} is not served here (serving {model_id!r})", 404)
    if body.get("stream"):
        raise ChatRequestError("stream: true is not supported by this server")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages or not all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
            for m in messages):
        raise ChatRequestError("messages must be a non-empty list of {role: str, content: str}")
    max_tokens = body.get("max_tokens") or body.get("max_completion_tokens") or DEFAULT_MAX_TOKENS
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
        raise ChatRequestError(f"max_tokens must be a positive integer, not {max_tokens!r}")
    prefill = ""
    if body.get("continue_final_message"):
        if messages[-1]["role"] != "assistant":
            raise ChatRequestError("continue_final_message needs a final assistant message")
        prefill, messages = messages[-1]["content"], messages[:-1]
    return [{"role": m["role"], "content": m["content"]} for m in messages], prefill, max_tokens


def chat_completion(content: str, model_id: str) -> dict:
    """An OpenAI ``chat.completion`` response holding one assistant message."""
    return {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
            "model": model_id,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}]}


def _error(message: str, status: int):
    from starlette.responses import JSONResponse

    kind = "invalid_request_error" if status < 500 else "server_error"
    return JSONResponse({"error": {"message": message, "type": kind, "code": status}}, status_code=status)


class OpenAIChatServer:
    """The Serve replica: ``POST .../v1/chat/completions`` and ``GET .../v1/models``.

    chat_factory: builds the ``ChatModel`` inside the replica (the model loads there, once).
    """

    def __init__(self, chat_factory: Callable[[], ChatModel], model_id: str) -> None:
        self.chat = chat_factory()
        self.model_id = model_id

    async def __call__(self, request):
        from starlette.responses import JSONResponse

        path = request.url.path.rstrip("/")
        if request.method == "GET" and path.endswith("/v1/models"):
            return JSONResponse({"object": "list", "data": [{"id": self.model_id, "object": "model",
                                                             "owned_by": "trajrag"}]})
        if request.method != "POST" or not path.endswith("/v1/chat/completions"):
            return _error(f"{request.method} {path} not found (POST /v1/chat/completions)", 404)
        try:
            messages, prefill, max_tokens = parse_chat_request(await _json_body(request), self.model_id)
        except ChatRequestError as exc:
            return _error(str(exc), exc.status)
        try:  # in a thread: the event loop keeps answering health checks while the model runs
            text = await asyncio.to_thread(self.chat.complete, messages, prefill=prefill, max_tokens=max_tokens)
        except ChatError as exc:
            return _error(str(exc), 500)
        content = text[len(prefill):] if prefill and text.startswith(prefill) else text
        return JSONResponse(chat_completion(content, self.model_id))


async def _json_body(request) -> Any:
    import json

    try:
        return json.loads(await request.body())
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise ChatRequestError("the request body is not JSON") from None


def build_app(chat_factory: Callable[[], ChatModel], serve_cfg) -> Any:
    """The Serve application (``OpenAIChatServer`` bound to ``chat_factory``) of ``llm.serve``."""
    from ray import serve

    deployment = serve.deployment(
        OpenAIChatServer, name="OpenAIChatServer", max_ongoing_requests=serve_cfg.max_ongoing_requests,
        ray_actor_options={"num_cpus": serve_cfg.num_cpus})
    return deployment.bind(chat_factory, serve_cfg.model_id)


def base_url(serve_cfg) -> str:
    """``http://host:port[/prefix]/v1`` of the app (what ``llm.chat.base_url`` wants)."""
    return f"http://{serve_cfg.host}:{serve_cfg.port}{serve_cfg.route_prefix.rstrip('/')}/v1"


def start_local_llm(cfg: LLMConfig, *, chat_factory: Optional[Callable[[], ChatModel]] = None,
                    ready_timeout_s: float = 60.0) -> str:
    """Deploy the chat model as an OpenAI-compatible Serve app (``cfg``: the ``llm`` section) and
    return its base URL.

    Ray must be initialised (or reachable). Serve's HTTP options are set on first start only:
    if Serve already runs with another host/port, shut it down first (``shutdown(stop_serve=True)``).
    chat_factory: builds the model in the replica; default: the local GGUF of ``llm.chat``
    (loaded in the replica, ~15-30 s). Waits until the endpoint answers ``GET /v1/models``.
    """
    from ray import serve

    factory = chat_factory or functools.partial(make_local_chat, cfg.chat)
    serve.start(http_options={"host": cfg.serve.host, "port": cfg.serve.port})
    serve.run(build_app(factory, cfg.serve), name=cfg.serve.app_name, route_prefix=cfg.serve.route_prefix)
    url = base_url(cfg.serve)
    _wait_ready(url + "/models", ready_timeout_s)
    return url


def _wait_ready(url: str, timeout_s: float) -> None:
    """Poll until the proxy routes to the app (it learns new routes asynchronously)."""
    deadline = time.monotonic() + timeout_s
    last = ""
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, OSError) as exc:
            last = str(getattr(exc, "reason", exc))
        time.sleep(0.25)
    raise TimeoutError(f"LLM Serve app not answering at {url} after {timeout_s:.0f} s ({last})")


def shutdown(app_name: str, *, stop_serve: bool = False) -> None:
    """Delete the app ``app_name`` (``llm.serve.app_name``); with ``stop_serve`` also stop Serve
    itself (controller and HTTP proxies, freeing the port) so it can restart with other options."""
    from ray import serve

    serve.delete(app_name)
    if stop_serve:
        serve.shutdown()


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m trajrag.distributed.serve_llm``: serve the local model until interrupted."""
    import argparse
    import os

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE")
    parser.add_argument("--address", default=None, help="Ray cluster address (default: start a local Ray)")
    args = parser.parse_args(argv)
    config.check_overrides(args.overrides)
    cfg = config.settings(args.overrides).llm
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    import ray

    ray.init(address=args.address, include_dashboard=False)
    url = start_local_llm(cfg, ready_timeout_s=300.0)
    print(f"serving the local chat model at {url} (Ctrl-C stops)", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        shutdown(cfg.serve.app_name, stop_serve=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
