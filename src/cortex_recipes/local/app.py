"""The FastAPI app: Cortex Training REST routes over a :class:`~cortex_recipes.local.backend.Backend`.

Every client mistake is a 4xx whose JSON body is ``{"message", "code"}`` (the SDK reads both).
In hosted-conformance mode every ``/api/v2/`` request passes the PAT check and stamps its job's
idle clock first (:mod:`~cortex_recipes.local.hosted_gate`).
An exception nobody anticipated is a 500 that names the operation (the route) and is logged
with its traceback; the tests sweep malformed input to show no input class reaches it.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import anyio
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.requests import ClientDisconnect

from cortex_recipes.local import bodies, hosted_gate
from cortex_recipes.local.backend import Backend
from cortex_recipes.local.errors import BackendError

log = logging.getLogger(__name__)

PREFIX = "/api/v2/databases/{database}/schemas/{schema}/cortex-training"
DEFAULT_MAX_BODY_BYTES = 64 * 1024 * 1024 + 64 * 1024  # the SDK's 60 MiB frames plus chunk overhead


def _error(status: int, message: str, code: Any = None) -> JSONResponse:
    return JSONResponse(
        status_code=status,
        content={"message": message, "code": code if code is not None else status},
    )


async def _body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isascii() and declared.isdigit() and int(declared) > limit:
        raise BackendError(
            f"request body of {declared} bytes exceeds the limit of {limit} bytes", status=413
        )
    data = bytearray()
    try:
        async for chunk in request.stream():
            data.extend(chunk)
            if len(data) > limit:
                raise BackendError(f"request body exceeds the limit of {limit} bytes", status=413)
    except ClientDisconnect:
        # The client went away mid-upload: nothing to answer, nothing of the server's failed.
        log.info(
            "client disconnected during the upload to %s after %d bytes",
            request.url.path,
            len(data),
        )
        raise BackendError("the client disconnected before the request body ended") from None
    return bytes(data)


async def _json(request: Request, limit: int, what: str) -> Any:
    return bodies.parse_json(await _body(request, limit), f"{what} body")


def create_app(
    state_dir: Path,
    *,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    result_chunk_bytes: int = 8 * 1024 * 1024,
    threads: int | None = None,
    device: str = "auto",
    hosted: bool = False,
    api_token: str | None = None,
) -> FastAPI:
    """``api_token``: the PAT a hosted-mode app requires (None: a new one, not shown)."""
    backend = Backend(
        state_dir,
        device=device,
        threads=threads,
        result_chunk_bytes=result_chunk_bytes,
        hosted=hosted,
    )
    registry, data_plane = backend.registry, backend.data_plane
    app = FastAPI(title="cortex-recipes local backend", docs_url=None, redoc_url=None)
    app.state.backend = backend
    if hosted:
        token = hosted_gate.server_token(api_token)
        app.add_middleware(hosted_gate.HostedGate, token=token, touch=registry.touch)

    @app.exception_handler(BackendError)
    async def _backend_error(_: Request, exc: BackendError) -> JSONResponse:
        return _error(exc.status, exc.message, exc.code)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        return _error(400, f"invalid request: {exc.errors()}")

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        route = request.scope.get("route")
        operation = getattr(route, "name", None) or request.url.path
        log.error("unexpected error in %s %s", request.method, operation, exc_info=exc)
        return _error(
            500, f"internal error in {operation}: {type(exc).__name__}; see the server log"
        )

    @app.on_event("shutdown")
    def _shutdown() -> None:
        backend.shutdown()

    @app.get("/healthz")
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.post(PREFIX)
    async def create_job(request: Request, database: str, schema: str) -> dict[str, Any]:
        return registry.create(await _json(request, max_body_bytes, "create-job"))

    @app.get(PREFIX)
    def list_jobs(database: str, schema: str, status: str | None = None) -> dict[str, Any]:
        return {"jobs": registry.list(status)}

    @app.get(PREFIX + "/capacity")
    def capacity(database: str, schema: str) -> dict[str, Any]:
        total, in_use = registry.cuda_count, registry.gpus_in_use()
        return {
            "has_reservation": False,
            "max_total_gpus": total,
            "in_use_gpus": in_use,
            "pending_gpus": 0,
            "available_gpus": total - in_use,
            "device_mode": registry.device_mode,
        }

    @app.get(PREFIX + "/{job_id}")
    def get_job(database: str, schema: str, job_id: str) -> dict[str, Any]:
        return registry.describe(registry.get(job_id))

    @app.post(PREFIX + "/{job_action}")
    def job_action(database: str, schema: str, job_action: str) -> dict[str, Any]:
        job_id, sep, action = job_action.partition(":")
        if sep and action == "cancel":
            return {"job_id": job_id, "status": registry.cancel(job_id).status}
        raise BackendError(
            f"unknown job action {job_action!r}; accepted: {{job_id}}:cancel", status=405
        )

    @app.post(PREFIX + "/{job_id}/forward-backward")
    async def forward_backward(
        request: Request, database: str, schema: str, job_id: str
    ) -> dict[str, Any]:
        data = await _body(request, max_body_bytes)
        return data_plane.forward_backward(job_id, data)

    @app.post(PREFIX + "/{job_id}/forward")
    async def forward(
        request: Request,
        database: str,
        schema: str,
        job_id: str,
        sub_job_id: str | None = None,
        sub_job_type: str | None = None,
    ) -> dict[str, Any]:
        """A no-grad forward whose body is the raw DSSST1 frame (cortex_recipes.raw_forward),
        routed by the ``sub_job_id`` / ``sub_job_type`` query parameters."""
        data = await _body(request, max_body_bytes)
        job = registry.require_running(job_id)
        return data_plane.forward(job, sub_job_id, sub_job_type, data)

    @app.post(PREFIX + "/{job_id}/step")
    async def step(request: Request, database: str, schema: str, job_id: str) -> dict[str, Any]:
        return data_plane.step(job_id, await _json(request, max_body_bytes, "step"))

    @app.post(PREFIX + "/{job_id}/save")
    async def save(request: Request, database: str, schema: str, job_id: str) -> dict[str, Any]:
        return data_plane.save(job_id, await _json(request, max_body_bytes, "save"))

    @app.post(PREFIX + "/{job_id}/load")
    async def load(request: Request, database: str, schema: str, job_id: str) -> dict[str, Any]:
        return data_plane.load(job_id, await _json(request, max_body_bytes, "load"))

    @app.get(PREFIX + "/{job_id}/checkpoints")
    def list_checkpoints(database: str, schema: str, job_id: str) -> dict[str, Any]:
        return {"checkpoints": data_plane.list_checkpoints(job_id)}

    @app.delete(PREFIX + "/{job_id}/checkpoints/{checkpoint_id}")
    def delete_checkpoint(
        database: str, schema: str, job_id: str, checkpoint_id: str
    ) -> dict[str, Any]:
        data_plane.delete_checkpoint(job_id, checkpoint_id)
        return {"job_id": job_id, "checkpoint_id": checkpoint_id, "deleted": True}

    @app.post(PREFIX + "/{job_id}/generate")
    async def generate(request: Request, database: str, schema: str, job_id: str) -> dict[str, Any]:
        return data_plane.generate(job_id, await _body(request, max_body_bytes))

    @app.post(PREFIX + "/{job_id}/operation")
    async def operation(
        request: Request, database: str, schema: str, job_id: str
    ) -> dict[str, Any]:
        body = await _json(request, max_body_bytes, "operation")
        # In a thread: cancel-request waits for its target and a draining reset-prefix-cache for
        # the sampler's rows; neither may hold the event loop that serves everyone else.
        return await anyio.to_thread.run_sync(backend.operation, job_id, body)

    @app.get(PREFIX + "/{job_id}/requests/{request_id}")
    async def request_status(
        database: str,
        schema: str,
        job_id: str,
        request_id: str,
        cursor: str | None = None,
        max_events: int | None = None,
    ) -> dict[str, Any]:
        if not cursor:  # a first poll is held until the request settles (bounded)
            await data_plane.wait_for_request(job_id, request_id)
        return await anyio.to_thread.run_sync(
            data_plane.request_status, job_id, request_id, cursor, max_events
        )

    return app
