"""The inference adapter: what prime-rl's orchestrator and env-server need of a vLLM server,
served from a Cortex sampling sub-job through the SDK.

Routes (prime-rl 559b447 ``utils/client.py``; admin calls strip ``/v1``):
- ``GET /health``, ``GET /v1/models`` (with ``max_model_len``) and
  ``POST /inference/v1/generate``: the token-in/token-out gateway of
  :mod:`cortex_recipes.gateway`, unchanged (every sampling key prime-rl sends is accepted;
  ``cache_salt`` is dropped because each weight sync resets the sampler's prefix cache);
- ``POST /pause?mode=keep|wait`` and ``POST /resume``: while paused, new generate calls wait
  here. With ``keep`` the rows already decoding are also held, at the sampler's next decode
  step, with their caches (the local backend's ``pause-generation`` operation), and continue
  on whatever weights the sampler holds at ``/resume``, as vLLM's ``keep`` does; each result
  says which version made which tokens. A backend without that operation (hosted Cortex)
  answers 400 once, and from then on the rows already there finish on their own, as with
  ``wait``. Both return at once: a weight sync never waits behind a generation (the sampler
  swaps weights between two decode steps);
- ``POST /update_weights {"weight_dir": ".../broadcasts/step_<v>"}`` and
  ``POST /load_lora_adapter {"lora_name", "lora_path"}``: make the sampler hold exactly version
  ``v``: a ``weight_sync`` from the training sub-job, only while the trainer adapter's live file
  says this job's training sub-job holds ``v`` and is not stepping
  (:mod:`cortex_recipes.primerl.broadcasts`), then a prefix-cache reset and the ``APPLIED``
  marker, naming this job. Asking again for the version already applied
  is a no-op (prime-rl retries these calls); asking for a version whose weights are no longer
  (or not yet) live is a 409 naming both versions: a wrong label is never produced;
- ``GET /metrics``: Prometheus text of this adapter's own counters (``cortex_recipes:*``;
  prime-rl mirrors only ``vllm:*`` families and tolerates their absence).

Seeds: prime-rl sends no ``seed``, and the header the gateway would derive one from
(``X-Session-ID``) is a fresh ``uuid4`` per rollout, so two runs never drew the same samples. A
generate request without ``sampling_params.seed`` gets one here (:class:`TaskSeeds`) from the
base seed, the weight version the rollout started at (prime-rl's ``cache_salt``; the sampler's
version when absent), the prompt's token ids, and how many requests with that same version and
prompt came before it. A group's ``group_size`` rollouts of a prompt therefore draw seeds
``0..group_size-1`` of that key in whatever order they arrive: the group's samples are a
function of the weights and the prompt, not of timing or trace ids. A seed the caller sends is
used as is.

One weight update runs at a time. The server binds 127.0.0.1.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from pathlib import Path
from typing import Any

import anyio
import requests
from fastapi import Request
from fastapi.responses import JSONResponse, PlainTextResponse

from cortex_recipes.endpoint import sub_job_ids
from cortex_recipes.gateway import create_gateway_app, sdk_generate
from cortex_recipes.primerl import broadcasts

log = logging.getLogger(__name__)

PAUSE_MODES = ("keep", "wait")
# How long the sampler holds its rows for a pause nobody lifts (prime-rl allows 720 s per
# weight-update attempt); the backend then decodes again on its own.
PAUSE_MAX_S = 900.0
WEIGHT_FORMATS = ("hf", "vllm", "lora")


class TaskSeeds:
    """Per-request seeds that do not depend on arrival order or trace ids (module docstring).

    ``seed_for(prompt_ids, salt)`` returns ``sha256(base_seed, salt, prompt ids, k)`` folded to
    32 bits, where ``k`` counts the earlier calls with the same ``salt`` and prompt ids. The
    counts live in memory: a restarted adapter counts from 0 again, so a resumed run redraws the
    seeds the killed run drew for the same version and prompt (the same samples again, which is
    what an uninterrupted run would have trained on)."""

    def __init__(self, base_seed: int = 0):
        self.base_seed = int(base_seed)
        self._counts: dict[tuple[str, str], int] = {}
        self._lock = threading.Lock()

    def seed_for(self, prompt_ids: list[int], salt: str) -> int:
        prompt_key = hashlib.sha256(",".join(str(int(t)) for t in prompt_ids).encode()).hexdigest()
        with self._lock:
            k = self._counts.get((salt, prompt_key), 0)
            self._counts[(salt, prompt_key)] = k + 1
        digest = hashlib.sha256(f"{self.base_seed}:{salt}:{prompt_key}:{k}".encode()).digest()
        return int.from_bytes(digest[:4], "big")


class _SeedGenerateRequests:
    """ASGI middleware: give a ``POST /inference/v1/generate`` body without
    ``sampling_params.seed`` a :class:`TaskSeeds` seed before the gateway reads it. A body that
    is not such a JSON object passes untouched (the gateway's own checks answer it)."""

    def __init__(self, app, seeds: TaskSeeds, version_of_sampler):
        self.app = app
        self.seeds = seeds
        self.version_of_sampler = version_of_sampler

    def _with_seed(self, raw: bytes) -> bytes | None:
        try:
            body = json.loads(raw)
        except ValueError:
            return None
        if not isinstance(body, dict):
            return None
        prompt = body.get("token_ids")
        params = body.get("sampling_params")
        if params is None:
            params = {}
        if (
            not isinstance(prompt, list)
            or not all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)
            or not isinstance(params, dict)
            or params.get("seed") is not None
        ):
            return None
        salt = params.get("cache_salt")
        if not isinstance(salt, str) or not salt:
            version = self.version_of_sampler()
            salt = "base" if version is None else str(version)
        body["sampling_params"] = {**params, "seed": self.seeds.seed_for(prompt, salt)}
        return json.dumps(body).encode()

    async def __call__(self, scope, receive, send):
        if (
            scope["type"] != "http"
            or scope["method"] != "POST"
            or scope["path"] != "/inference/v1/generate"
        ):
            await self.app(scope, receive, send)
            return
        chunks = []
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                await self.app(scope, _replay([message], receive), send)
                return
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        raw = b"".join(chunks)
        seeded = self._with_seed(raw)
        if seeded is not None:
            raw = seeded
            headers = [(k, v) for k, v in scope["headers"] if k.lower() != b"content-length"]
            scope = {**scope, "headers": [*headers, (b"content-length", str(len(raw)).encode())]}
        body_message = {"type": "http.request", "body": raw, "more_body": False}
        await self.app(scope, _replay([body_message], receive), send)


def _replay(messages: list[dict], receive):
    pending = list(messages)

    async def replayed():
        if pending:
            return pending.pop(0)
        return await receive()

    return replayed


class WeightVersionConflict(RuntimeError):
    """The asked-for version is not what the training sub-job holds; becomes a 409."""


class InferenceAdapter:
    """The app and the weight-version logic behind it; ``app`` is a FastAPI application."""

    def __init__(
        self,
        client,
        job_id: str,
        *,
        model: str,
        max_model_len: int,
        output_dir: Path,
        weight_format: str = "hf",
        base_seed: int = 0,
    ):
        if weight_format not in WEIGHT_FORMATS:
            raise ValueError(
                f"weight_format={weight_format!r}; accepted: {', '.join(WEIGHT_FORMATS)}"
            )
        self.client = client
        self.job_id = job_id
        self.output_dir = Path(output_dir)
        self.weight_format = weight_format
        ids = sub_job_ids(client.get_job(job_id))
        if "sampling" not in ids:
            raise ValueError(f"job {job_id} has no sampling sub-job (it has {sorted(ids)})")
        # None for a sampling-only job: it serves, but cannot take weight updates.
        self.training, self.sampling = ids.get("training"), ids["sampling"]
        # None: the base weights (a new job's sampler holds none of an earlier job's versions)
        self.version = broadcasts.latest_applied(self.output_dir, job_id)
        self._resumed = threading.Event()
        self._resumed.set()
        # False once the backend said it has no pause-generation operation (hosted Cortex)
        self.holds_rows = True
        self._update_lock = threading.Lock()
        self.counters = {
            "generate_requests": 0,
            "generate_tokens": 0,
            "weight_updates": 0,
            "weight_update_noops": 0,
            "weight_update_conflicts": 0,
            "pauses": 0,
        }
        self.last_update_s = 0.0
        #: (start, end) of every generate call, time.monotonic(): what overlapped training
        self.generation_intervals: list[tuple[float, float]] = []
        sampler = sdk_generate(client, job_id)

        def generate(prompt_ids: list[int], params: dict) -> dict:
            self._resumed.wait()
            t0 = time.monotonic()
            result = sampler(prompt_ids, params)
            self.generation_intervals.append((t0, time.monotonic()))
            self.counters["generate_requests"] += 1
            self.counters["generate_tokens"] += len(result.get("token_ids") or [])
            return result

        self.seeds = TaskSeeds(base_seed)
        self.app = create_gateway_app(
            generate, model=model, max_model_len=max_model_len, base_seed=base_seed
        )
        self.app.add_middleware(
            _SeedGenerateRequests, seeds=self.seeds, version_of_sampler=lambda: self.version
        )
        self._add_routes()

    # -- weights ---------------------------------------------------------------------------

    def apply(self, weight_dir: str | Path, weight_format: str | None = None) -> dict[str, Any]:
        """Make the sampler hold exactly the version ``weight_dir`` names."""
        version = broadcasts.version_of(weight_dir)
        with self._update_lock:
            if self.version == version:
                self.counters["weight_update_noops"] += 1
                return {"version": version, "synced": False}
            manifest = broadcasts.read_manifest(broadcasts.version_dir(self.output_dir, version))
            if (
                Path(weight_dir).resolve()
                != broadcasts.version_dir(self.output_dir, version).resolve()
            ):
                raise broadcasts.BroadcastError(
                    f"weight_dir={str(weight_dir)!r} is not under this adapter's output_dir "
                    f"{str(self.output_dir)!r}"
                )
            live = broadcasts.read_live(self.output_dir)
            if (
                live is None
                or live["version"] != version
                or live["state"] != "stable"
                or live.get("job_id") != self.job_id
            ):
                self.counters["weight_update_conflicts"] += 1
                if live is None:
                    held = "no published version"
                elif live.get("job_id") != self.job_id:
                    held = f"nothing of this job (the live file names job {live.get('job_id')})"
                else:
                    held = "version {version} ({state})".format(**live)
                raise WeightVersionConflict(
                    f"weight_dir names version {version}, but the training sub-job holds "
                    f"{held}; syncing now would label other weights as this version"
                )
            if self.training is None:
                raise WeightVersionConflict(
                    f"job {self.job_id} has no training sub-job to sync version {version} from"
                )
            t0 = time.monotonic()
            fmt = weight_format or self.weight_format
            self.client.poll_request(
                self.job_id,
                self.client.weight_sync(
                    self.job_id, self.training, [self.sampling], weight_format=fmt
                ),
            )
            # drain=False: rows in flight finish on the weights they started with (prime-rl's
            # keep mode); hosted's default drain would wait for every one of them (up to
            # timeout_s) and fail the update when they take longer.
            self.client.reset_prefix_cache(self.job_id, sub_job_id=self.sampling, drain=False)
            self.last_update_s = time.monotonic() - t0
            self.version = version
            self.counters["weight_updates"] += 1
            broadcasts.mark_applied(
                self.output_dir,
                version,
                {
                    "job_id": self.job_id,
                    "checkpoint_id": manifest["checkpoint_id"],
                    "sync_s": round(self.last_update_s, 3),
                },
            )
            log.info("sampler now holds version %d (%.2f s)", version, self.last_update_s)
            return {"version": version, "synced": True}

    # -- pause ---------------------------------------------------------------------------

    def hold_rows(self, hold: bool) -> bool:
        """Ask the sampling sub-job to hold (or go on decoding) the rows it already has, at
        its next decode step; False when the backend cannot (then they finish as they are)."""
        if not self.holds_rows:
            return False
        operation = "pause-generation" if hold else "resume-generation"
        body: dict[str, Any] = {"operation_type": operation, "sub_job_id": self.sampling}
        if hold:
            body["payload"] = {"max_s": PAUSE_MAX_S}
        url = f"{self.client._prefix}/{self.job_id}/operation"  # the SDK's own URL and session
        try:
            self.client._send("POST", url, json=body, retry_on=lambda _: False)
        except requests.HTTPError as exc:
            status = getattr(exc.response, "status_code", None)
            if status not in (400, 404):
                raise
            self.holds_rows = False
            log.info(
                "the sampler has no %s operation (HTTP %s): a pause holds new generate calls "
                "only, and the rows already decoding finish on the weights they have",
                operation,
                status,
            )
            return False
        return True

    # -- routes ----------------------------------------------------------------------------

    def _add_routes(self) -> None:
        app = self.app

        def fail(status: int, message: str) -> JSONResponse:
            return JSONResponse({"error": message}, status_code=status)

        # The admin routes are async (no worker thread) and weight updates have a thread limiter
        # of their own: sync routes share anyio's 40 worker threads, and generate calls held by a
        # pause occupy theirs. With 40 or more held (the SmolLM2 profile keeps 64 in flight),
        # an update or a resume that needed one of those threads would never run: deadlock.
        update_limiter = anyio.CapacityLimiter(1)
        pause_limiter = anyio.CapacityLimiter(1)  # pause and resume reach the backend in order

        @app.get("/health")
        async def health() -> dict:
            return {"status": "ok", "paused": not self._resumed.is_set()}

        @app.post("/pause")
        async def pause(mode: str = "keep", clear_cache: str = "false") -> Any:
            if mode not in PAUSE_MODES:
                return fail(400, f"mode={mode!r}; accepted: {', '.join(PAUSE_MODES)}")
            if clear_cache not in ("true", "false"):
                return fail(400, f"clear_cache={clear_cache!r}; accepted: true, false")
            self._resumed.clear()
            self.counters["pauses"] += 1
            held = False
            if mode == "keep":
                try:
                    held = await anyio.to_thread.run_sync(
                        self.hold_rows, True, limiter=pause_limiter
                    )
                except requests.RequestException as exc:
                    return fail(502, f"the sampler did not take the pause: {_what_failed(exc)}")
            return {"status": "paused", "rows_held": held}

        @app.post("/resume")
        async def resume() -> Any:
            self._resumed.set()
            try:
                await anyio.to_thread.run_sync(self.hold_rows, False, limiter=pause_limiter)
            except requests.RequestException as exc:
                return fail(502, f"the sampler did not take the resume: {_what_failed(exc)}")
            return {"status": "resumed"}

        def update(weight_dir: Any, weight_format: str | None, field: str) -> Any:
            if not isinstance(weight_dir, str) or not weight_dir:
                return fail(
                    400,
                    f"{field}={weight_dir!r}; accepted: a path '<output_dir>/broadcasts/step_<v>'",
                )
            try:
                broadcasts.version_of(weight_dir)
            except broadcasts.BroadcastError as exc:
                return fail(400, f"{field}: {exc}")
            try:
                return self.apply(weight_dir, weight_format)
            except broadcasts.BroadcastError as exc:
                return fail(404, str(exc))
            except WeightVersionConflict as exc:
                return fail(409, str(exc))

        @app.post("/update_weights")
        async def update_weights(request: Request) -> Any:
            body = await _json_object(request)
            if isinstance(body, JSONResponse):
                return body
            return await anyio.to_thread.run_sync(
                update, body.get("weight_dir"), None, "weight_dir", limiter=update_limiter
            )

        @app.post("/load_lora_adapter")
        async def load_lora_adapter(request: Request) -> Any:
            body = await _json_object(request)
            if isinstance(body, JSONResponse):
                return body
            name = body.get("lora_name")
            if not isinstance(name, str) or not name:
                return fail(400, f"lora_name={name!r}; accepted: a non-empty string")
            answer = await anyio.to_thread.run_sync(
                update, body.get("lora_path"), "lora", "lora_path", limiter=update_limiter
            )
            if not isinstance(answer, JSONResponse) and name not in app.state.models:
                app.state.models.append(name)
            return answer

        @app.get("/metrics")
        async def metrics() -> PlainTextResponse:
            lines = [f"cortex_recipes:{k}_total {v}" for k, v in self.counters.items()]
            lines.append(
                f"cortex_recipes:policy_version {-1 if self.version is None else self.version}"
            )
            lines.append(f"cortex_recipes:last_weight_update_seconds {self.last_update_s:.6f}")
            lines.append(f"cortex_recipes:paused {0 if self._resumed.is_set() else 1}")
            return PlainTextResponse("\n".join(lines) + "\n")


def _what_failed(exc: requests.RequestException) -> str:
    """The failure without its URL (a hosted account's host stays out of answers and logs)."""
    status = getattr(exc.response, "status_code", None)
    return type(exc).__name__ + (f" (HTTP {status})" if status is not None else "")


async def _json_object(request: Request) -> dict | JSONResponse:
    try:
        body = await request.json()
    except ValueError:
        return JSONResponse({"error": "the body must be a JSON object"}, status_code=400)
    if not isinstance(body, dict):
        return JSONResponse(
            {"error": f"the body must be a JSON object, got {type(body).__name__}"},
            status_code=400,
        )
    return body
