"""The HTTP layer: an unanticipated exception is a 500 that names the operation."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from cortex_recipes.local.app import PREFIX, create_app

pytestmark = pytest.mark.unit

JOBS = PREFIX.format(database="LOCAL", schema="PUBLIC")


def test_an_unexpected_exception_is_a_500_naming_the_operation_and_logged(tmp_path, caplog):
    app = create_app(tmp_path, device="cpu")

    def broken(status=None):
        raise RuntimeError("bug in the registry")

    app.state.backend.registry.list = broken
    with TestClient(app, raise_server_exceptions=False) as http:
        response = http.get(JOBS)
        assert response.status_code == 500
        assert response.json()["message"] == (
            "internal error in list_jobs: RuntimeError; see the server log"
        )
        assert "bug in the registry" not in response.text  # details stay in the log
        # The server keeps answering.
        assert http.get("/healthz").json() == {"status": "ok"}
    assert any("list_jobs" in r.getMessage() and r.exc_info for r in caplog.records)


def test_client_mistakes_are_4xx_with_message_and_code(tmp_path):
    app = create_app(tmp_path, device="cpu")
    with TestClient(app) as http:
        deep = "[" * 5000 + "]" * 5000
        response = http.post(JOBS, content=deep, headers={"Content-Type": "application/json"})
        assert response.status_code == 400
        assert response.json() == {
            "message": "create-job body: the JSON body nests deeper than 32 levels",
            "code": 400,
        }
        missing = http.get(f"{JOBS}/no-such-job")
        assert missing.status_code == 404 and "no-such-job" in missing.json()["message"]


def _frame_with_header_op(op: str) -> bytes:
    """A DSSST1 frame whose header's operation metadata is the JSON text ``op`` (built from a
    real frame's header, as a hostile client would write one by hand)."""
    import json
    import struct

    import torch
    from cortex_training import wire

    real = wire.dumps({"a": torch.zeros(2)}, metadata={"x": 0})
    (size,) = struct.unpack("<Q", real[:8])
    header = json.loads(real[8 : 8 + size])
    header["__metadata__"]["op"] = op
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + real[8 + size :]


def test_too_deep_errors_name_the_format_that_was_too_deep():
    """A JSON body, a DSSST1 frame header and a DSSST1 frame nested 1e5 deep: each 400 says
    which of them it was."""
    from cortex_recipes.local import bodies
    from cortex_recipes.local.errors import BackendError

    deep = "[" * 100_000 + "]" * 100_000
    with pytest.raises(BackendError, match=r"^create-job body: the JSON body nests deeper"):
        bodies.parse_json(deep.encode(), "create-job body")
    frame = _frame_with_header_op(deep)
    with pytest.raises(BackendError) as err:
        bodies.request_chunk(frame, "forward-backward")
    assert str(err.value).startswith(
        "forward-backward: the DSSST1 frame header (its JSON metadata) nests deeper than 32"
    )
    shallow_but_past_the_bound = '{"x": ' + json_nested(40) + "}"
    with pytest.raises(BackendError, match="DSSST1 frame header"):
        bodies.request_chunk(_frame_with_header_op(shallow_but_past_the_bound), "generate")


def json_nested(depth: int) -> str:
    return "[" * depth + "]" * depth
