"""A token-in/token-out gateway: ``/inference/v1/generate`` in front of a sampling sub-job.

Shared by the TITO journey (verifiers' ``TrainClient``) and the async GRPO journey's inference
adapter (:mod:`cortex_recipes.primerl.inference`, prime-rl's vLLM client), so it lives in
neither.

verifiers' ``TrainClient`` (through ``renderers.client.generate``) speaks vLLM's token-in route:
``POST /inference/v1/generate`` with ``{"model", "token_ids", "sampling_params"}``. It reads
``choices[0].token_ids`` and per-token logprobs in the ``"token_id:<id>"`` form, and checks
prompt lengths against ``GET /v1/models``. This gateway implements exactly that with the SDK's
token-id ``generate`` on a sampling sub-job, so the same journey runs against the local backend
and a hosted Cortex endpoint. Prompt ids go to the sampler untouched: nothing is decoded or
re-encoded here.

Seeds: a request without ``sampling_params.seed`` gets one derived from its ``X-Session-ID``
header and prompt length, so a seeded episode replays exactly. The gateway binds 127.0.0.1.
"""

from __future__ import annotations

import hashlib
import logging
import math
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from cortex_recipes.rollouts import chosen_logprob

log = logging.getLogger(__name__)

SESSION_HEADER = "x-session-id"
FORWARDED = {"max_tokens", "temperature", "top_p", "top_k", "seed", "stop_token_ids"}
# Accepted and dropped. ``cache_salt`` (prime-rl: ``str(policy_version_at_start)``) salts vLLM's
# prefix cache per weight version; the SDK has no salt, so whoever syncs weights resets the
# sampler's prefix cache instead. ``return_token_ids``: completion ids are always returned.
IGNORED = {
    "logprobs", "skip_special_tokens", "routed_experts_prompt_start", "n", "min_p",
    "repetition_penalty", "include_stop_str_in_output", "spaces_between_special_tokens",
    "cache_salt", "return_token_ids",
}  # fmt: skip


class GatewayError(ValueError):
    """A generate request the gateway refuses; becomes a 400 naming the field."""


def derived_seed(session_id: str, prompt_len: int, base_seed: int) -> int:
    digest = hashlib.sha256(f"{base_seed}:{session_id}:{prompt_len}".encode()).digest()
    return int.from_bytes(digest[:4], "big")


def translate_params(raw: Any, session_id: str, prompt_len: int, base_seed: int) -> dict:
    """vLLM sampling params -> the SDK's; unknown keys are refused, known no-ops dropped."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise GatewayError(f"sampling_params must be an object, got {type(raw).__name__}")
    unknown = sorted(set(raw) - FORWARDED - IGNORED)
    if unknown:
        raise GatewayError(
            f"sampling_params has unsupported keys {unknown}; supported: "
            f"{sorted(FORWARDED)} (ignored: {sorted(IGNORED)})"
        )
    params = {k: raw[k] for k in FORWARDED if raw.get(k) is not None}
    if params.get("top_k") == -1:
        params.pop("top_k")  # vLLM's "no top-k"
    params.setdefault("seed", derived_seed(session_id, prompt_len, base_seed))
    params["logprobs"] = 0  # the sampled token's own logprob
    params["skip_special_tokens"] = False
    return params


def to_vllm_choice(result: dict) -> dict:
    token_ids = [int(t) for t in result["token_ids"]]
    entries = result.get("logprobs") or []
    if len(entries) != len(token_ids):
        raise GatewayError(
            f"the sampler returned {len(entries)} logprob entries for {len(token_ids)} tokens"
        )
    content = []
    for token, entry in zip(token_ids, entries, strict=True):
        try:
            logprob = chosen_logprob(entry, token)
        except ValueError as exc:
            raise GatewayError(f"the sampler's logprobs: {exc}") from exc
        if not math.isfinite(logprob):
            raise GatewayError(f"the sampler returned a non-finite logprob for token {token}")
        content.append({"token": f"token_id:{token}", "logprob": logprob})
    return {
        "index": 0,
        "token_ids": token_ids,
        "finish_reason": result.get("finish_reason") or "length",
        "logprobs": {"content": content},
    }


def create_gateway_app(
    generate: Callable[[list[int], dict], dict],
    *,
    model: str,
    max_model_len: int,
    base_seed: int = 0,
):
    """The FastAPI app. ``generate(prompt_ids, params)`` returns one SDK generate result.

    ``app.state.models`` lists the served model names (``model`` first); a caller may add an
    alias, e.g. a LoRA adapter's name once it is loaded."""
    app = FastAPI(title="cortex-recipes TITO gateway", docs_url=None, redoc_url=None)
    app.state.models = [model]
    app.state.requests = []  # (session id, prompt ids, completion ids) for audits and tests
    counter = iter(range(1, 1 << 62))

    @app.get("/v1/models")
    def models() -> dict:
        return {
            "object": "list",
            "data": [
                {"id": name, "object": "model", "max_model_len": max_model_len}
                for name in app.state.models
            ],
        }

    @app.post("/inference/v1/generate")
    def generate_route(body: dict, request: Request):
        try:
            if body.get("model") not in app.state.models:
                return JSONResponse(
                    {
                        "error": f"model={body.get('model')!r} is not served; this gateway serves {app.state.models!r}"
                    },
                    status_code=404,
                )
            prompt = body.get("token_ids")
            if (
                not isinstance(prompt, list)
                or not prompt
                or not all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)
            ):
                raise GatewayError("token_ids must be a non-empty list of integers")
            if len(prompt) >= max_model_len:
                raise GatewayError(
                    f"token_ids has {len(prompt)} tokens; max_model_len is {max_model_len}"
                )
            session = request.headers.get(SESSION_HEADER, "")
            params = translate_params(body.get("sampling_params"), session, len(prompt), base_seed)
            result = generate(prompt, params)
            choice = to_vllm_choice(result)
        except GatewayError as exc:
            return JSONResponse({"error": str(exc)}, status_code=400)
        app.state.requests.append((session, list(prompt), choice["token_ids"]))
        n = len(choice["token_ids"])
        return {
            "request_id": f"gen-{next(counter)}",
            "choices": [choice],
            "prompt_token_ids": list(prompt),
            "usage": {
                "prompt_tokens": len(prompt),
                "completion_tokens": n,
                "total_tokens": len(prompt) + n,
            },
        }

    return app


def sdk_generate(client, job_id: str) -> Callable[[list[int], dict], dict]:
    """``generate`` for the gateway: the SDK's token-id generate, which the SDK routes to the
    job's sampling sub-job."""

    def generate(prompt_ids: list[int], params: dict) -> dict:
        request_id = client.generate(job_id, [list(prompt_ids)], params)
        return client.poll_request(job_id, request_id)["results"][0]

    return generate


class Gateway:
    """Run the gateway app on 127.0.0.1 in a background thread; ``base_url`` ends in ``/v1``."""

    def __init__(self, app, host: str = "127.0.0.1"):
        import uvicorn

        self.app = app
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((host, 0))
        self.port = self._sock.getsockname()[1]
        self.base_url = f"http://{host}:{self.port}/v1"
        config = uvicorn.Config(app, log_level="warning", access_log=False)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._sock]}, daemon=True
        )

    def __enter__(self) -> Gateway:
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("the TITO gateway did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)
        self._sock.close()
