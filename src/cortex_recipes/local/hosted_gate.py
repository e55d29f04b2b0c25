"""The HTTP gate of hosted-conformance mode: the PAT headers and the idle clock's request stamps.

- ``pat-headers`` (:mod:`cortex_recipes.local.hosted`): every request under ``/api/v2/`` must
  carry ``Authorization: Bearer <token>`` and ``X-Snowflake-Authorization-Token-Type:
  PROGRAMMATIC_ACCESS_TOKEN``, as the SDK's ``from_pat`` sends them, else a 401 naming the
  missing or wrong header (never the token). ``/healthz`` stays open. The token is random per
  backend start: :class:`~cortex_recipes.local.server.LocalBackend` hands it to the server
  process in ``$CORTEX_RECIPES_HOSTED_TOKEN`` (an environment variable, never an argument) and
  gives its clients the headers; ``cortex-recipes serve --hosted`` reads the same variable or
  generates a token it never shows. The server removes the variable from its environment, so
  worker processes never see it. The token is never logged or written to a file.
- ``idle-timeout``: a request on a job's own paths (``/{job_id}/...``: the data plane,
  ``/operation``, request polls, checkpoints) stamps the job's idle clock, when it arrives and
  when it is answered. Reading the job (``GET /{job_id}``) does not: watching a job does not
  keep it alive.
"""

from __future__ import annotations

import hmac
import logging
import os
import secrets
from typing import Any

from cortex_recipes.local import hosted

log = logging.getLogger(__name__)

TOKEN_ENV = "CORTEX_RECIPES_HOSTED_TOKEN"
AUTHORIZATION = "Authorization"
TOKEN_TYPE = "X-Snowflake-Authorization-Token-Type"
PAT_TOKEN_TYPE = "PROGRAMMATIC_ACCESS_TOKEN"
API_PREFIX = "/api/v2/"
# /api/v2/databases/{db}/schemas/{schema}/cortex-training/{job_id}/...: the job id's segment.
_JOB_SEGMENT = 8


def new_token() -> str:
    return secrets.token_urlsafe(32)


def pat_headers(token: str) -> dict[str, str]:
    """The headers the SDK's ``CortexTrainingClient.from_pat`` sets, for ``token``."""
    return {AUTHORIZATION: f"Bearer {token}", TOKEN_TYPE: PAT_TOKEN_TYPE}


def take_token() -> str | None:
    """``$CORTEX_RECIPES_HOSTED_TOKEN``, removed from this process's environment so that the
    worker processes it starts do not inherit it."""
    return os.environ.pop(TOKEN_ENV, None) or None


def server_token(given: str | None) -> str:
    """The token a hosted-mode server checks: ``given`` (from the environment), else a new one
    that is not shown anywhere (set ``$CORTEX_RECIPES_HOSTED_TOKEN`` to choose it)."""
    if given:
        return given
    log.info(
        "hosted-conformance mode: $%s is not set, so a random PAT was generated for this start "
        "and is not shown; set $%s to choose the token clients must send",
        TOKEN_ENV,
        TOKEN_ENV,
    )
    return new_token()


def pat_problem(headers: dict[str, str], token: str) -> str | None:
    """What is wrong with a request's PAT headers (``headers`` keys lowercased), or None."""
    authorization = headers.get(AUTHORIZATION.lower())
    if authorization is None:
        return f"header {AUTHORIZATION} is missing; hosted Cortex needs '{AUTHORIZATION}: Bearer <PAT>'"
    scheme, _, value = authorization.partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        return f"header {AUTHORIZATION} is not 'Bearer <PAT>' (value not shown)"
    if not hmac.compare_digest(value.strip().encode(), token.encode()):
        return (
            f"header {AUTHORIZATION} carries a token this backend did not issue (value not "
            f"shown); LocalBackend.client() sends the right one, `serve --hosted` takes it from "
            f"${TOKEN_ENV}"
        )
    kind = headers.get(TOKEN_TYPE.lower())
    if kind is None:
        return (
            f"header {TOKEN_TYPE} is missing; hosted Cortex needs '{TOKEN_TYPE}: {PAT_TOKEN_TYPE}'"
        )
    if kind != PAT_TOKEN_TYPE:
        shown = kind if len(kind) <= 40 else kind[:40] + "..."
        return f"header {TOKEN_TYPE}={shown!r}; accepted: {PAT_TOKEN_TYPE}"
    return None


def job_of(path: str) -> str | None:
    """The job id of a path below a job (``.../cortex-training/{job_id}/...``), else None."""
    parts = path.split("/")
    if len(parts) > _JOB_SEGMENT + 1 and parts[_JOB_SEGMENT - 1] == "cortex-training":
        return parts[_JOB_SEGMENT] or None
    return None


class HostedGate:
    """Pure ASGI middleware (the request body streams through untouched): the PAT check, then
    the idle clock's stamps (``touch(job_id)``) around a request below a job."""

    def __init__(self, app: Any, *, token: str, touch: Any):
        self.app, self._token, self._touch = app, token, touch

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or not scope["path"].startswith(API_PREFIX):
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        problem = pat_problem(headers, self._token)
        if problem is not None:
            from fastapi.responses import JSONResponse

            error = hosted.refuse("pat-headers", problem, 401)
            response = JSONResponse(
                status_code=401,
                content={"message": error.message, "code": 401},
                headers={"WWW-Authenticate": "Bearer"},
            )
            await response(scope, receive, send)
            return
        job_id = job_of(scope["path"])
        if job_id is not None:
            self._touch(job_id)
        try:
            await self.app(scope, receive, send)
        finally:
            if job_id is not None:
                self._touch(job_id)
