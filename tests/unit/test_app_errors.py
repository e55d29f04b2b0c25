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
            "message": "create-job body nests deeper than 32 levels",
            "code": 400,
        }
        missing = http.get(f"{JOBS}/no-such-job")
        assert missing.status_code == 404 and "no-such-job" in missing.json()["message"]
