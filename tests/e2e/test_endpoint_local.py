import pytest
import requests

from cortex_recipes.endpoint import connect

from .conftest import inference

pytestmark = pytest.mark.e2e


def test_local_connection_starts_a_backend_and_stops_it(tmp_path):
    with connect("local", state_dir=tmp_path) as client:
        assert client.base_url.startswith("http://127.0.0.1:")
        job_id = client.create_job([inference()])
        client.wait_for_job(job_id)
        request = client.generate(job_id, [[11, 12]], {"max_tokens": 2, "temperature": 0.0})
        assert len(client.poll_request(job_id, request)["results"][0]["token_ids"]) == 2
        url = client.base_url
    with pytest.raises(requests.ConnectionError):
        requests.get(f"{url}/healthz", timeout=2)
