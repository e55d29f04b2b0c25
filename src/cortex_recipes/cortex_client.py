"""The SDK's client as journeys use it: every HTTP failure names the operation, the sub-job and
what the server said (:class:`CortexCallError`), a connection file's endpoint that does not
answer is named once (:class:`~cortex_recipes.endpoint.EndpointUnreachable`), a job that ends
while the run needs it (``terminated`` included, which the SDK's ``wait_for_job`` does not treat
as final) is named with its state and reason (:class:`JobEnded`), every job is created with
:data:`DEFAULT_IDLE_TIMEOUT_S` unless the caller names one, and every job the run created is
cancelled when it ends (:meth:`ExplainedClient.cancel_open_jobs`)."""

from __future__ import annotations

import inspect
import logging
import time
from typing import Any

import requests

log = logging.getLogger(__name__)

# The idle_timeout_seconds every job is created with unless the caller names one. Hosted Cortex
# terminates a job that gets no request for its idle timeout, 1800 s by default: shorter than a
# journey's job can legitimately sit idle -- a trainer job while a long evaluation runs on a
# sampling job of its own, a prime-rl trainer while its orchestrator compiles or its environments
# stall, a resumed run's first job while its checkpoint loads. One hour covers those pauses and
# still reclaims a forgotten job (cancel_open_jobs cancels them on every ordinary exit; this is
# the backstop when the process is killed). Hosted accepts 0 (never) or 300..604800.
DEFAULT_IDLE_TIMEOUT_S = 3600
# How often wait_for_job asks the local backend (no connection file) whether a job runs.
LOCAL_JOB_POLL_S = 0.1
# Job states after which a job never runs again (``done``: legacy); normalised as the SDK does.
FINAL_JOB_STATES = ("failed", "done", "cancelled", "canceled", "terminated")


class CortexCallError(RuntimeError):
    """An SDK call the server refused: the operation, the sub-job and the server's message."""

    def __init__(
        self, operation: str, sub_job: str | None, status: int | None, code: Any, message: str
    ):
        self.operation, self.sub_job = operation, sub_job
        self.status, self.code, self.message = status, code, message
        where = f" on sub-job {sub_job}" if sub_job else ""
        super().__init__(f"{operation}{where} failed: HTTP {status} (code {code}): {message}")


class JobEnded(CortexCallError):
    """A job reached a final state (failed, cancelled, done, terminated) while the run needed it:
    names the operation, the job, the state and the server's reason."""

    def __init__(self, operation: str, job_id: str, state: str, reason: str, detail: str = ""):
        self.operation, self.sub_job, self.job_id = operation, job_id, job_id
        self.state, self.reason = state, reason
        self.status, self.code = None, f"job_{state}"
        self.message = f"job {job_id} is {state}: {reason or 'no reason given'}"
        if state == "terminated":
            self.message += (
                "; an endpoint terminates a job that gets no request for its "
                "idle_timeout_seconds (hosted default 1800 s): keep the job busy, or create it "
                "with a larger idle_timeout_seconds (0: never; journeys send "
                f"{DEFAULT_IDLE_TIMEOUT_S})"
            )
        RuntimeError.__init__(
            self, f"{operation} failed: {self.message}" + (f" ({detail})" if detail else "")
        )


def job_state(job: dict) -> str:
    """A job description's status as the SDK normalises it: lowercase, ``job_state_`` dropped."""
    return str(job.get("status") or "").lower().removeprefix("job_state_")


def _accepts(method: Any, name: str) -> bool:
    """Whether ``method`` takes the keyword ``name`` (or any keyword)."""
    try:
        parameters = inspect.signature(method).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == name or p.kind is p.VAR_KEYWORD for p in parameters)


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
        """The SDK's ``create_job``, with ``idle_timeout_seconds`` set to
        :data:`DEFAULT_IDLE_TIMEOUT_S` when the caller names none and the SDK takes it."""
        if (
            kwargs.get("idle_timeout_seconds") is None
            and len(args) < 4  # (job_id, experiment_name, hardware, idle_timeout_seconds)
            and _accepts(self._client.create_job, "idle_timeout_seconds")
        ):
            kwargs["idle_timeout_seconds"] = DEFAULT_IDLE_TIMEOUT_S
        job_id = self.__getattr__("create_job")(sub_jobs, *args, **kwargs)
        self._open_jobs.append(job_id)
        return job_id

    def wait_for_job(self, job_id: str) -> dict:
        """Poll ``get_job`` until the job runs, as the SDK's ``wait_for_job`` does (its poll
        interval, backoff and ``poll_timeout``), but with ``terminated`` final too: a
        :class:`JobEnded` on ``failed``, ``cancelled``, ``done`` or ``terminated``, a
        ``TimeoutError`` at the deadline. On the local backend (no connection file) it looks
        every :data:`LOCAL_JOB_POLL_S` instead: a question on the loopback costs next to
        nothing, and the SDK's backoff left a ready job waiting up to 2 s."""
        sdk = self._client
        timeout = float(getattr(sdk, "poll_timeout", 1800.0))
        delay = float(getattr(sdk, "poll_interval", 0.5))
        backoff = float(getattr(sdk, "poll_backoff_multiplier", 1.25))
        longest = float(getattr(sdk, "poll_max_interval", 6.0))
        if self._connection is None:
            delay, backoff, longest = LOCAL_JOB_POLL_S, 1.0, LOCAL_JOB_POLL_S
        deadline = time.monotonic() + timeout
        while True:
            job = self.__getattr__("get_job")(job_id)
            state = job_state(job)
            if state == "running":
                break
            if state in FINAL_JOB_STATES:
                raise JobEnded("wait_for_job", job_id, state, str(job.get("reason") or ""))
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(
                    f"Job {job_id} did not become running within {timeout}s (last state {state!r})"
                )
            time.sleep(min(delay, remaining))
            delay = min(delay * backoff, longest)
        self._sub_jobs[job_id] = {
            s["job_type"]: s["sub_job_id"] for s in job.get("sub_jobs", []) if "sub_job_id" in s
        }
        return job

    def poll_request(self, job_id: str, request_id: str) -> dict:
        """The SDK's ``poll_request``; when the request fails because its job has ended (an idle
        job terminated, say), a :class:`JobEnded` naming the job's state and reason."""
        try:
            return self.__getattr__("poll_request")(job_id, request_id)
        except RuntimeError as exc:
            ended = self._ended(job_id)
            if ended is None:
                raise
            raise JobEnded("poll_request", job_id, *ended, detail=f"{request_id}: {exc}") from exc

    def _ended(self, job_id: str) -> tuple[str, str] | None:
        """``(state, reason)`` of ``job_id`` when it has reached a final state, else None (also
        when it cannot be read)."""
        try:
            job = self._client.get_job(job_id)
        except Exception:  # the failure being explained is the caller's; keep that one
            return None
        state = job_state(job) if isinstance(job, dict) else ""
        return (state, str(job.get("reason") or "")) if state in FINAL_JOB_STATES else None

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
