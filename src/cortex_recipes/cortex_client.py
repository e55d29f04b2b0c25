"""The SDK's client as journeys use it: every HTTP failure names the operation, the sub-job and
what the server said (:class:`CortexCallError`), a connection file's endpoint that does not
answer is named once (:class:`~cortex_recipes.endpoint.EndpointUnreachable`), and every job the
run created is cancelled when it ends (:meth:`ExplainedClient.cancel_open_jobs`)."""

from __future__ import annotations

import logging
from typing import Any

import requests

log = logging.getLogger(__name__)


class CortexCallError(RuntimeError):
    """An SDK call the server refused: the operation, the sub-job and the server's message."""

    def __init__(
        self, operation: str, sub_job: str | None, status: int | None, code: Any, message: str
    ):
        self.operation, self.sub_job = operation, sub_job
        self.status, self.code, self.message = status, code, message
        where = f" on sub-job {sub_job}" if sub_job else ""
        super().__init__(f"{operation}{where} failed: HTTP {status} (code {code}): {message}")


# Which sub-job type an operation runs on, when the call does not name one.
_OPERATION_SUB_JOB = {
    "forward_backward": "training",
    "step": "training",
    "save": "training",
    "load": "training",
    "generate": "sampling",
}


def server_message(response: requests.Response | None) -> tuple[Any, str]:
    """``(code, message)`` from an error response body, or the status and raw text."""
    if response is None:
        return None, "no response"
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict) and ("message" in body or "code" in body):
        return body.get("code"), str(body.get("message"))
    return response.status_code, (response.text or response.reason or "")[:2000]


class ExplainedClient:
    """A ``CortexTrainingClient`` whose HTTP failures say what the server said.

    Every method is the SDK's own; a ``requests.HTTPError`` it raises becomes a
    :class:`CortexCallError` (chained, so :func:`cortex_recipes.reconnect.is_recoverable`
    still sees the status). It also remembers the jobs it created, so that
    :meth:`cancel_open_jobs` can cancel whatever a failing run left running.
    """

    def __init__(self, client: Any, connection: str | None = None):
        self._client = client
        # a connection file's path (None: the local backend), named when it cannot be reached
        self._connection = connection
        self._open_jobs: list[str] = []
        self._sub_jobs: dict[str, dict[str, str]] = {}

    @property
    def sdk(self) -> Any:
        return self._client

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._client, name)
        if not callable(attr) or name.startswith("_"):
            return attr

        def call(*args, **kwargs):
            try:
                return attr(*args, **kwargs)
            except requests.exceptions.ConnectionError as exc:
                if self._connection is None:
                    raise
                from cortex_recipes.endpoint import EndpointUnreachable

                raise EndpointUnreachable(
                    f"{name}: the endpoint of connection file {self._connection} did not answer "
                    f"after the SDK's retries ({type(exc).__name__}); check its host or base_url, "
                    "the network and the service, then rerun the same command to resume"
                ) from exc
            except requests.exceptions.HTTPError as exc:
                code, message = server_message(exc.response)
                status = exc.response.status_code if exc.response is not None else None
                raise CortexCallError(
                    name, self._sub_job_of(name, args, kwargs), status, code, message
                ) from exc

        return call

    def _sub_job_of(self, operation: str, args: tuple, kwargs: dict) -> str | None:
        for key in ("sub_job_id", "source_sub_job_id", "target_sub_job_id"):
            if kwargs.get(key):
                return str(kwargs[key])
        if operation == "weight_sync" and len(args) >= 2:
            return f"{args[1]} -> {args[2] if len(args) > 2 else kwargs.get('target_sub_job_ids')}"
        job_id = args[0] if args and isinstance(args[0], str) else kwargs.get("job_id")
        kind = _OPERATION_SUB_JOB.get(operation)
        if job_id and kind:
            return self._sub_jobs.get(job_id, {}).get(kind, f"{job_id}:{kind}")
        return job_id

    def create_job(self, sub_jobs: list, *args, **kwargs) -> str:
        job_id = self.__getattr__("create_job")(sub_jobs, *args, **kwargs)
        self._open_jobs.append(job_id)
        return job_id

    def wait_for_job(self, job_id: str) -> dict:
        job = self.__getattr__("wait_for_job")(job_id)
        self._sub_jobs[job_id] = {
            s["job_type"]: s["sub_job_id"] for s in job.get("sub_jobs", []) if "sub_job_id" in s
        }
        return job

    def cancel_job(self, job_id: str) -> None:
        self.__getattr__("cancel_job")(job_id)
        if job_id in self._open_jobs:
            self._open_jobs.remove(job_id)

    def cancel_open_jobs(self) -> None:
        """Cancel every job this client created and did not cancel; failures are logged."""
        for job_id in list(self._open_jobs):
            try:
                self._client.cancel_job(job_id)
                log.info("cancelled job %s as the run ended", job_id)
            except Exception as exc:  # the backend may be gone; nothing else to do here
                log.warning("could not cancel job %s: %s: %s", job_id, type(exc).__name__, exc)
            self._open_jobs.remove(job_id)
