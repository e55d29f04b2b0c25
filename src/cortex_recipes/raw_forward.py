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
"""

from __future__ import annotations

from typing import Any

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
    client, job_id: str, frame: bytes, *, sub_job_id: str, sub_job_type: str | None = None
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
