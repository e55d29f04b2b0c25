"""Warm spare workers: a job started on pre-imported spares computes exactly what a job on
freshly spawned workers computes, and the pool hands out only live spares, only for CPU."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from cortex_recipes import frames
from cortex_recipes.endpoint import sub_job_ids
from cortex_recipes.local import LocalBackend
from cortex_recipes.local.server import WARM_WORKERS_ENV, warm_workers_setting
from cortex_recipes.local.workers import SparePool

from .conftest import inference, start, training

pytestmark = pytest.mark.e2e

PROMPT = [1, 2, 3, 4, 5, 6, 7, 8]
SAMPLING = {"max_tokens": 6, "temperature": 1.0, "seed": 7, "logprobs": 0}


def exercise(client, job_id: str) -> dict:
    """Seeded samples, one SFT step, seeded samples from the synced weights."""
    before = client.poll_request(job_id, client.generate(job_id, [PROMPT], SAMPLING))["results"]
    row = frames.Row(token_ids=PROMPT + before[0]["token_ids"], weights=[0.0] * 8 + [1.0] * 6)
    frame = frames.sft_frame(frames.pad_batch([row], 0))
    result = client.poll_request(job_id, client.forward_backward(job_id, frame))
    client.poll_request(job_id, client.step(job_id))
    ids = sub_job_ids(client.get_job(job_id))
    client.poll_request(
        job_id, client.weight_sync(job_id, ids["training"], [ids["sampling"]], weight_format="hf")
    )
    after = client.poll_request(job_id, client.generate(job_id, [PROMPT], SAMPLING))["results"]
    return {
        "before": [(r["token_ids"], r["logprobs"]) for r in before],
        "loss": result["avg_loss"],
        "after": [(r["token_ids"], r["logprobs"]) for r in after],
    }


def worker_logs(state_dir: Path, job_id: str) -> str:
    return "".join(p.read_text() for p in (state_dir / "jobs" / job_id / "run").glob("*.log"))


def test_a_job_on_warm_spares_computes_what_one_on_fresh_workers_does(backend, client, tmp_path):
    warm_job = start(client, [training(), inference()])
    warm = exercise(client, warm_job)
    client.cancel_job(warm_job)
    assert worker_logs(backend.state_dir, warm_job).count("runs on a warm spare worker") == 2

    with LocalBackend(tmp_path / "cold", threads=1, warm_workers=0) as cold_backend:
        cold_client = cold_backend.client(max_retries=0, poll_interval=0.02, poll_timeout=300)
        cold_job = start(cold_client, [training(), inference()])
        cold = exercise(cold_client, cold_job)
        assert "warm spare" not in worker_logs(cold_backend.state_dir, cold_job)
    assert warm == cold
    assert warm["before"] != warm["after"]  # the step and the sync changed what is sampled


def test_the_pool_hands_out_live_spares_for_cpu_sub_jobs_only(tmp_path):
    pool = SparePool(1, tmp_path / "spares.log")
    try:
        assert pool.take(SimpleNamespace(device="cuda:0")) is None
        (first,) = pool._spares
        first.process.kill()
        first.process.wait()
        assert pool.take(SimpleNamespace(device="cpu")) is None  # dead: skipped and replaced
        (second,) = pool._spares
        assert second is not first and second.process.poll() is None
        assert pool.take(SimpleNamespace(device="cpu")) is second and pool.taken == 1
        assert len(pool._spares) == 1  # its replacement is already starting
        taken = second
    finally:
        pool.close()
    taken.sock.close()  # nobody sent a spec: the spare exits on the closed socket
    assert taken.process.wait(timeout=120) == 0
    assert all(s.process.poll() is not None for s in pool._spares) or not pool._spares
    assert pool.take(SimpleNamespace(device="cpu")) is None  # closed


def test_warm_workers_setting_fails_naming_the_value(monkeypatch):
    monkeypatch.delenv(WARM_WORKERS_ENV, raising=False)
    assert warm_workers_setting(None) == 0 and warm_workers_setting(3) == 3
    monkeypatch.setenv(WARM_WORKERS_ENV, "2")
    assert warm_workers_setting(None) == 2
    monkeypatch.setenv(WARM_WORKERS_ENV, "many")
    with pytest.raises(ValueError, match=r"\$CORTEX_RECIPES_WARM_WORKERS='many'"):
        warm_workers_setting(None)
    with pytest.raises(ValueError, match=r"warm_workers=9"):
        warm_workers_setting(9)
    with pytest.raises(ValueError, match=r"warm_workers=-1"):
        SparePool(-1, Path("unused.log"))
