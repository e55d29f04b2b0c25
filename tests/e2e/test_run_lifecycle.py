"""The run lifecycle against the real SDK and local backend: server messages, cancel on failure."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import pytest

from cortex_recipes.cortex_client import CortexCallError
from cortex_recipes.run import open_run
from cortex_recipes.training_job import Trainer

from .conftest import training

pytestmark = pytest.mark.e2e


@dataclass(frozen=True)
class Profile:
    name: str = "lifecycle"
    config_hash: str = "h"
    raw: dict = field(default_factory=dict)


def connection_file(tmp_path, backend) -> str:
    path = tmp_path / "connection.json"
    path.write_text(json.dumps({"base_url": backend.base_url, "database": "db", "schema": "sc"}))
    return str(path)


def test_a_bad_request_reports_the_server_message_and_the_failed_run_leaves_no_job(
    tmp_path, backend, client
):
    run = open_run("e2e", Profile(), {}, log_path=str(tmp_path / "run"))
    job_id = None
    connection = connection_file(tmp_path, backend)
    with pytest.raises(CortexCallError) as caught, run.connect(connection) as explained:
        trainer = Trainer.start(explained, [training()], run)
        job_id = trainer.job_id
        trainer.poll(explained.forward_backward(job_id, b"not a DSSST1 frame"))
    error = caught.value
    assert error.operation == "forward_backward" and error.status == 400
    assert error.sub_job == f"{job_id}:training:0"
    assert "Client Error" not in str(error) and error.message in str(error)
    assert client.get_job(job_id)["status"].lower() in ("cancelled", "canceled")
