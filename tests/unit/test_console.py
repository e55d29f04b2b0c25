"""The SDK's operation-body prints go to the run's debug.log inside a run's connection, and
only there: the rest of the process still prints to stdout (cortex_recipes.console)."""

from __future__ import annotations

import pytest
import requests
from cortex_training import CortexTrainingClient

from cortex_recipes.console import sdk_output_to

pytestmark = pytest.mark.unit


def _client(monkeypatch) -> CortexTrainingClient:
    client = CortexTrainingClient(base_url="http://127.0.0.1:9", database="db", schema="s")
    response = requests.Response()
    response.status_code = 200
    response._content = b'{"request_id": "r1"}'
    monkeypatch.setattr(client, "_send", lambda *a, **k: response)  # no network
    return client


def test_the_sdk_prints_operation_bodies_to_stdout_outside_a_run(monkeypatch, capsys):
    _client(monkeypatch)._operation("job-1", "forward", payload=b"frame")
    assert "***** POST operation" in capsys.readouterr().out  # what the SDK does on its own


def test_inside_a_run_they_go_to_the_debug_log_and_stdout_stays_clean(
    monkeypatch, capsys, tmp_path
):
    client = _client(monkeypatch)
    with sdk_output_to(tmp_path / "debug.log"):
        client._operation("job-1", "forward", payload=b"frame")
        print("the project's own line")
    out = capsys.readouterr().out
    assert "***** POST operation" not in out and "the project's own line" in out
    logged = (tmp_path / "debug.log").read_text()
    assert "***** POST operation" in logged and "job-1/operation" in logged
    assert "the project's own line" not in logged
    client._operation("job-2", "forward", payload=b"frame")  # the block is over
    assert "job-2/operation" in capsys.readouterr().out
    assert "job-2" not in (tmp_path / "debug.log").read_text()
