"""The inference adapter's pause toward the sampler: ``keep`` asks the backend to hold its rows
(``pause-generation``); a backend without that operation (hosted Cortex answers 400) is asked
once, and from then on only new calls wait. Any other failure is raised, never swallowed.
The SDK client is replaced by a recorder of what the adapter posts (the HTTP path itself runs
in tests/e2e/test_primerl_adapters.py and tests/e2e/test_continuous_batching.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import requests

from tests import extras

pytest.importorskip("msgspec", reason=extras.reason("grpo"))

from cortex_recipes.primerl.inference import PAUSE_MAX_S, InferenceAdapter, _what_failed


class Recorder:
    _prefix = "http://127.0.0.1:1/api/v2/databases/D/schemas/S/cortex-training"

    def __init__(self, status: int | None = None, error: Exception | None = None):
        self.status, self.error, self.posts = status, error, []

    def _send(self, method, url, *, json, retry_on):
        self.posts.append((method, url, json))
        assert retry_on(RuntimeError()) is False  # a pause is not retried behind prime-rl's back
        if self.error is not None:
            raise self.error
        if self.status is not None:
            response = requests.Response()
            response.status_code = self.status
            raise requests.HTTPError(f"{self.status} for url {url}", response=response)


def adapter(client) -> SimpleNamespace:
    return SimpleNamespace(client=client, job_id="J", sampling="J:sampling:0", holds_rows=True)


def test_keep_asks_the_sampler_to_hold_its_rows_and_resume_lifts_it():
    client = Recorder()
    a = adapter(client)
    assert InferenceAdapter.hold_rows(a, True) is True
    assert InferenceAdapter.hold_rows(a, False) is True
    (m1, u1, b1), (_, _, b2) = client.posts
    assert (m1, u1) == ("POST", f"{Recorder._prefix}/J/operation")
    assert b1 == {
        "operation_type": "pause-generation",
        "sub_job_id": "J:sampling:0",
        "payload": {"max_s": PAUSE_MAX_S},
    }
    assert b2 == {"operation_type": "resume-generation", "sub_job_id": "J:sampling:0"}


@pytest.mark.parametrize("status", [400, 404])
def test_a_backend_without_the_operation_is_asked_once(status):
    client = Recorder(status=status)
    a = adapter(client)
    assert InferenceAdapter.hold_rows(a, True) is False
    assert a.holds_rows is False
    assert InferenceAdapter.hold_rows(a, False) is False
    assert InferenceAdapter.hold_rows(a, True) is False
    assert len(client.posts) == 1


@pytest.mark.parametrize(
    "error",
    [
        requests.ConnectionError("connection refused: http://account.example/x"),
        requests.HTTPError("503", response=SimpleNamespace(status_code=503)),
    ],
)
def test_other_failures_are_raised_and_named_without_the_url(error):
    a = adapter(Recorder(error=error))
    with pytest.raises(requests.RequestException) as raised:
        InferenceAdapter.hold_rows(a, True)
    assert a.holds_rows is True  # a transient failure does not turn the hold off for good
    text = _what_failed(raised.value)
    assert "account.example" not in text and "http" not in text
    assert text.startswith(type(error).__name__)
