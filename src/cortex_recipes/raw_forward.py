"""A no-grad ``forward`` whose body is the raw DSSST1 frame, sent on the SDK client's own session.

The SDK's ``CortexTrainingClient.forward()`` posts ``/operation`` with the frame base64-wrapped
in JSON; the hosted service hands that JSON on to a ``/forward`` route that expects raw DSSST1
bytes, and refuses it (the SDK's REST reference, section 7.1, "Known limitation"). Teacher
scoring (OPD) and log-likelihood scoring therefore post the frame as it is:

    POST {prefix}/{job_id}/forward?sub_job_id=...[&sub_job_type=...]
    Content-Type: application/octet-stream          body: one DSSST1 frame

and poll the returned ``request_id`` like any other request. The request goes through the
client's ``_send`` (its ``requests`` session, auth headers, retries) and URL prefix: there is no
second HTTP stack, and the same code path runs against the local backend and hosted Cortex.

That route is what the SDK's reference says the service forwards to, but it is not in the
reference's endpoint index, so whether hosted Cortex serves it to clients is not known.
:func:`score` therefore probes the endpoint once per job and sub-job (the first score, at a
run's start): a route the server does not have (404 or 405) falls back to the documented
``/operation`` ``forward`` with a JSON payload (the SDK sends a dict "as-is": token ids as
lists), and the choice is logged. Either way the logprobs are read where hosted's assembler may
put them (:func:`logprobs_of`), and a batch is padded to the sub-job's rank count with filler
rows that are dropped from the answer (hosted refuses fewer rows than ranks).
"""

from __future__ import annotations

import logging
import weakref
from typing import Any

import requests
import torch

log = logging.getLogger(__name__)

ROUTE = "forward"
# The SDK's own ceiling for a forward payload (its operation path is not chunked).
MAX_FRAME_BYTES = 60 * 1024 * 1024


class RawForwardError(RuntimeError):
    """A raw forward that could not be sent or whose answer is not a request."""


def _transport(client) -> tuple[Any, str]:
    send, prefix = getattr(client, "_send", None), getattr(client, "_prefix", None)
    if not callable(send) or not isinstance(prefix, str):
        raise RawForwardError(
            f"{type(client).__name__} has no _send/_prefix: the raw forward transport is built "
            "on cortex-training 0.0.3's client; this SDK version is not supported"
        )
    return send, prefix


def submit(
    client,
    job_id: str,
    frame: bytes,
    *,
    sub_job_id: str,
    sub_job_type: str | None = None,
    retry_on: Any = None,
) -> str:
    """Post ``frame`` to ``sub_job_id``'s ``/forward``; the request id to poll."""
    if not isinstance(frame, bytes | bytearray | memoryview):
        raise RawForwardError(f"frame must be DSSST1 bytes, got {type(frame).__name__}")
    if len(frame) > MAX_FRAME_BYTES:
        raise RawForwardError(
            f"forward frame of {len(frame)} bytes exceeds {MAX_FRAME_BYTES} bytes; score fewer "
            "rows at a time"
        )
    send, prefix = _transport(client)
    params = {"sub_job_id": sub_job_id}
    if sub_job_type is not None:
        params["sub_job_type"] = sub_job_type
    response = send(
        "POST",
        f"{prefix}/{job_id}/{ROUTE}",
        data=bytes(frame),
        params=params,
        headers={"Content-Type": "application/octet-stream"},
        **({} if retry_on is None else {"retry_on": retry_on}),
    )
    try:
        body = response.json()
    except ValueError:
        body = None
    request_id = body.get("request_id") if isinstance(body, dict) else None
    if not isinstance(request_id, str) or not request_id:
        raise RawForwardError(
            f"forward on {sub_job_id} returned no request_id: {response.text[:200]!r}"
        )
    return request_id


def forward(
    client, job_id: str, frame: bytes, *, sub_job_id: str, sub_job_type: str | None = None
) -> Any:
    """:func:`submit`, then the polled result."""
    request_id = submit(client, job_id, frame, sub_job_id=sub_job_id, sub_job_type=sub_job_type)
    return client.poll_request(job_id, request_id)


# The two ways a no-grad forward reaches a sub-job (see the module doc).
RAW, OPERATION = "raw /forward", "/operation forward (JSON payload)"
# What a server without the raw route answers for it.
ROUTE_MISSING = (404, 405)
# Where a forward result may hold its logprobs: post_process_outputs (the local backend), then
# batch, then the top level (hosted's assembler may leave post_process_outputs empty).
PLACES = (("post_process_outputs", "logprobs"), ("batch", "logprobs"), ("logprobs",))

_routes: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_ranks: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def logprobs_of(result: Any) -> torch.Tensor:
    """The per-token logprobs tensor of a forward (or forward-backward) result, wherever the
    endpoint put it (:data:`PLACES`); a clear error naming the places looked at otherwise."""
    for path in PLACES:
        value = result
        for key in path:
            value = value.get(key) if isinstance(value, dict) else None
        if value is not None:
            if isinstance(value, list):
                value = torch.tensor(value, dtype=torch.float32)
            if not torch.is_tensor(value):
                raise RawForwardError(f"{'.'.join(path)} is {type(value).__name__}, not a tensor")
            return value
    keys = sorted(result) if isinstance(result, dict) else type(result).__name__
    raise RawForwardError(
        "the forward result holds no logprobs at post_process_outputs.logprobs, "
        f"batch.logprobs or logprobs (result keys: {keys})"
    )


def _is_transient(exc: BaseException) -> bool:
    from cortex_training.client import _is_transient as sdk_rule

    return sdk_rule(exc)


def _not_a_missing_route(exc: BaseException) -> bool:
    """The SDK's retry rule for the probe: transient failures, but not a missing route."""
    response = getattr(exc, "response", None)
    if isinstance(exc, requests.exceptions.HTTPError) and response is not None:
        return response.status_code not in ROUTE_MISSING and _is_transient(exc)
    return _is_transient(exc)


def _via_operation(client, job_id: str, input_ids: torch.Tensor, sub_job_id: str) -> Any:
    payload = {
        "args": [],
        "kwargs": {"input_ids": input_ids.tolist()},
        "processing": {"post": ["compute_logprobs"]},
    }
    answer = client.forward(job_id, payload, sub_job_id=sub_job_id)
    request_id = answer.get("request_id") if isinstance(answer, dict) else None
    if not isinstance(request_id, str) or not request_id:
        return answer  # an inline answer
    return client.poll_request(job_id, request_id)


def _ranks_of(client, job_id: str, sub_job_id: str) -> int:
    known = _ranks.setdefault(client, {})
    if sub_job_id not in known:
        from cortex_recipes.endpoint import sub_job_ranks

        known.update(sub_job_ranks(client.get_job(job_id)))
    return known.get(sub_job_id, 1)


def score(client, job_id: str, input_ids: torch.Tensor, *, sub_job_id: str) -> torch.Tensor:
    """Per-token, prediction-aligned logprobs ``[rows, width]`` of ``input_ids`` from a no-grad
    forward on ``sub_job_id``: padded to its ranks, sent on the route probed for this endpoint,
    read wherever the result holds them, filler rows dropped."""
    rows = int(input_ids.shape[0])
    from cortex_recipes.frames import filler_rows, teacher_frame

    padded = filler_rows(input_ids, _ranks_of(client, job_id, sub_job_id))
    routes = _routes.setdefault(client, {})
    route = routes.get((job_id, sub_job_id))
    if route == OPERATION:
        result = _via_operation(client, job_id, padded, sub_job_id)
    else:
        try:
            request_id = submit(
                client, job_id, teacher_frame(padded), sub_job_id=sub_job_id,
                retry_on=_not_a_missing_route,
            )  # fmt: skip
        except requests.exceptions.HTTPError as exc:
            status = exc.response.status_code if exc.response is not None else None
            if route is not None or status not in ROUTE_MISSING:
                raise
            log.warning(
                "forward route for %s: the raw /forward answered HTTP %s; using the "
                "documented %s", sub_job_id, status, OPERATION,
            )  # fmt: skip
            routes[(job_id, sub_job_id)] = OPERATION
            result = _via_operation(client, job_id, padded, sub_job_id)
        else:
            if route is None:
                log.info("forward route for %s: %s (probed)", sub_job_id, RAW)
                routes[(job_id, sub_job_id)] = RAW
            result = client.poll_request(job_id, request_id)
    logprobs = logprobs_of(result)
    if logprobs.dim() != 2 or logprobs.shape[0] < rows:
        raise RawForwardError(
            f"forward logprobs have shape {list(logprobs.shape)}; expected [{rows}+, width]"
        )
    return logprobs[:rows]
