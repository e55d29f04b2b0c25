"""The prime-rl adapters on the local backend (tiny-qwen3), driven the way prime-rl drives them.

The inference adapter is called by the real ``renderers.client.generate`` and verifiers'
``TrainClient``, and by HTTP admin calls shaped like prime-rl 559b447's ``utils/client.py``. The
trainer adapter reads rollout files in prime-rl's MicroBatch wire format built from what the
sampler actually produced. Pinned here: exact-version weight sync (checked against a fresh
sampler loaded from that version's checkpoint), the weight-version hazard, kill and resume.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests import extras

pytest.importorskip("msgspec", reason=extras.reason("grpo"))
# The real renderers client and verifiers TrainClient drive the adapters.
pytest.importorskip("verifiers", reason=extras.reason("tito"))

import msgspec
import requests
from openai import AsyncOpenAI

from cortex_recipes.gateway import Gateway
from cortex_recipes.models import resolve_model_path
from cortex_recipes.primerl import broadcasts
from cortex_recipes.primerl.inference import InferenceAdapter
from cortex_recipes.primerl.rollout_files import MicroBatch, rollout_path
from cortex_recipes.primerl.trainer import TrainerAdapter, TrainerAdapterConfig
from tests.e2e.conftest import TINY, inference, start, training

pytestmark = pytest.mark.e2e

MAX_MODEL_LEN = 256
# Every sampling key prime-rl's env-server was observed to send (reference doc), with its values.
PRIME_RL_SAMPLING = {
    "cache_salt": "0", "logprobs": 1, "max_tokens": 6, "min_p": 0.0, "return_token_ids": True,
    "skip_special_tokens": False, "stop_token_ids": [151645], "temperature": 1.0, "top_k": -1,
    "top_p": 1.0,
}  # fmt: skip


@pytest.fixture
def job(client):
    job_id = start(client, [training(lr=5e-2), inference()])
    yield job_id
    client.cancel_job(job_id)


def serve(client, job_id, output_dir):
    adapter = InferenceAdapter(
        client, job_id, model=TINY, max_model_len=MAX_MODEL_LEN, output_dir=output_dir
    )
    return adapter, Gateway(adapter.app)


def root(gateway) -> str:
    return gateway.base_url.removesuffix("/v1")


def generate(gateway, prompt, **params):
    body = {"model": TINY, "token_ids": prompt, "sampling_params": {**PRIME_RL_SAMPLING, **params}}
    response = requests.post(f"{root(gateway)}/inference/v1/generate", json=body, timeout=120)
    assert response.status_code == 200, response.text
    choice = response.json()["choices"][0]
    return choice["token_ids"], [c["logprob"] for c in choice["logprobs"]["content"]]


PROBE = [151644, 872, 198, 13048, 151645, 198, 151644, 77091, 198]


def probe(gateway):
    """Greedy ids and logprobs of a fixed prompt: what the sampler's weights are now."""
    return generate(gateway, PROBE, temperature=0.0, max_tokens=4, seed=0)


def fresh_probe(client, job_id, version_dir, output_dir, lora=None):
    """:func:`probe` on a new sampler loaded from the checkpoint a published version names:
    what that version's weights say, independently of the adapter that synced them."""
    manifest = broadcasts.read_manifest(version_dir)
    source = {"checkpoint_id": manifest["checkpoint_id"], "source_job_id": job_id}
    fresh = start(client, [inference(lora=lora, source=source)])
    try:
        adapter = InferenceAdapter(
            client, fresh, model=TINY, max_model_len=MAX_MODEL_LEN, output_dir=output_dir,
            weight_format="lora" if lora else "hf",
        )  # fmt: skip
        with Gateway(adapter.app) as gateway:
            return probe(gateway)
    finally:
        client.cancel_job(fresh)


def rollout_file(gateway, output_dir, step, seed):
    """Two samples from the sampler as prime-rl would ship them (advantages +1 and -1)."""
    ids, mask, adv, lps, pos, lengths = [], [], [], [], [], []
    for k, sign in enumerate((1.0, -1.0)):
        completion, logprobs = generate(gateway, PROBE, seed=seed + k)
        ids += PROBE + completion
        mask += [False] * len(PROBE) + [True] * len(completion)
        adv += [0.0] * len(PROBE) + [sign] * len(completion)
        lps += [0.0] * len(PROBE) + logprobs
        pos += list(range(len(PROBE) + len(completion)))
        lengths.append(len(PROBE) + len(completion))
    batch = MicroBatch(
        input_ids=ids, loss_mask=mask, advantages=adv, inference_logprobs=lps,
        position_ids=pos, sequence_lengths=lengths, temperatures=[1.0] * len(ids),
        env_names=["probe"] * len(ids), seq_lens=list(lengths),
    )  # fmt: skip
    path = rollout_path(output_dir, step)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".bin.tmp")
    tmp.write_bytes(msgspec.msgpack.encode([batch]))
    tmp.rename(path)  # as prime-rl's FileSystemMicroBatchSender does


def update_weights(gateway, output_dir, version):
    """prime-rl's weight update: pause, NCCL_READY, update_weights, resume (in a finally)."""
    weight_dir = broadcasts.version_dir(output_dir, version)
    base = root(gateway)
    assert requests.post(f"{base}/pause", params={"mode": "keep", "clear_cache": "false"}).ok
    try:
        weight_dir.mkdir(parents=True, exist_ok=True)  # as prime-rl does before the touch
        (weight_dir / "NCCL_READY").touch()
        return requests.post(
            f"{base}/update_weights", json={"weight_dir": str(weight_dir)}, timeout=300
        )
    finally:
        assert requests.post(f"{base}/resume").ok


def test_generate_speaks_prime_rl_sampling_keys_and_the_renderers_client(client, job, tmp_path):
    from renderers import create_renderer
    from renderers.client import generate as renderers_generate
    from renderers.configs import Qwen3RendererConfig
    from transformers import AutoTokenizer

    _, gateway = serve(client, job, tmp_path)
    with gateway:
        base = root(gateway)
        assert requests.get(f"{base}/health").json()["status"] == "ok"
        models = requests.get(f"{gateway.base_url}/models").json()["data"]
        assert models == [
            {"id": TINY, "object": "model", "max_model_len": MAX_MODEL_LEN}
        ]  # fmt: skip
        ids, logprobs = generate(gateway, PROBE)
        assert 0 < len(ids) <= 6 and len(logprobs) == len(ids)
        assert all(lp <= 0.0 for lp in logprobs)

        tokenizer = AutoTokenizer.from_pretrained(str(resolve_model_path(TINY)))
        renderer = create_renderer(tokenizer, Qwen3RendererConfig())
        openai = AsyncOpenAI(base_url=gateway.base_url, api_key="local")
        sampling = {k: v for k, v in PRIME_RL_SAMPLING.items() if k != "cache_salt"}
        result = asyncio.run(
            renderers_generate(
                client=openai,
                renderer=renderer,
                messages=[{"role": "user", "content": "What is 2+3?"}],
                model=TINY,
                sampling_params=sampling,
                cache_salt="3",
            )
        )
        assert len(result["completion_ids"]) == len(result["completion_logprobs"]) > 0
        metrics = requests.get(f"{base}/metrics").text
        assert "cortex_recipes:generate_requests_total 2" in metrics


def test_verifiers_train_client_runs_an_episode_through_the_adapter(client, job, tmp_path):
    import verifiers.v1 as vf
    from renderers.configs import Qwen3RendererConfig
    from verifiers.v1.clients import resolve_client
    from verifiers.v1.configs.client import TrainClientConfig

    from cortex_recipes.envs.glossary import (
        GlossaryConfig,
        GlossaryTaskset,
        GlossaryToolset,
        GlossaryToolsetConfig,
        tool_specs,
    )
    from cortex_recipes.tito.episode import run_episode

    adapter, gateway = serve(client, job, tmp_path)
    task = GlossaryTaskset(GlossaryConfig()).load()[0]
    toolset = GlossaryToolset(GlossaryToolsetConfig())
    os.environ.setdefault("CORTEX_PRIMERL_ADAPTER_KEY", "local")
    with gateway:
        train_client = resolve_client(
            TrainClientConfig(
                base_url=gateway.base_url,
                api_key_var="CORTEX_PRIMERL_ADAPTER_KEY",
                renderer=Qwen3RendererConfig(),
                renderer_model_name=str(resolve_model_path(TINY)),
            )
        )
        episode = asyncio.run(
            run_episode(
                train_client,
                model=TINY,
                task=task,
                toolset=toolset,
                tools=tool_specs(toolset),
                sampling=vf.SamplingConfig(temperature=1.0, max_tokens=8),
                session_id="primerl",
                max_turns=1,
            )
        )
    assert episode.turns and episode.turns[0].completion_ids
    assert sum(episode.sampled_mask) == len(episode.turns[0].completion_ids)
    assert adapter.counters["generate_requests"] == len(episode.turns)


def test_unseeded_calls_draw_the_same_group_in_a_second_adapter_whatever_the_trace_ids(
    client, job, tmp_path
):
    """prime-rl sends no seed and a fresh uuid4 as X-Session-ID per rollout: the group's samples
    must still repeat in a new adapter (a rerun, a resume), the same set whatever the order."""
    sampling = {k: v for k, v in PRIME_RL_SAMPLING.items() if k != "seed"}

    def group(session_ids):
        _, gateway = serve(client, job, tmp_path)
        with gateway:
            out = []
            for session in session_ids:
                body = {"model": TINY, "token_ids": PROBE, "sampling_params": sampling}
                response = requests.post(
                    f"{root(gateway)}/inference/v1/generate",
                    json=body,
                    headers={"X-Session-ID": session},
                    timeout=120,
                )
                assert response.status_code == 200, response.text
                out.append(tuple(response.json()["choices"][0]["token_ids"]))
            return out

    first = group([f"trace-a{k}" for k in range(4)])
    second = group([f"trace-b{k}" for k in range(4)])
    assert first == second
    assert len(set(first)) > 1  # four draws, not one seed reused


# More generate calls than anyio's 40 worker threads, which sync routes share: prime-rl keeps
# batch_size of them in flight (64 on the SmolLM2 profile) across a pause.
HELD_BY_PAUSE = 48


def test_pause_holds_new_generate_calls_until_resume(client, job, tmp_path):
    _, gateway = serve(client, job, tmp_path)
    with gateway:
        base = root(gateway)
        assert requests.post(f"{base}/pause", params={"mode": "abort"}).status_code == 400
        keep = requests.post(f"{base}/pause", params={"mode": "keep"})
        assert keep.ok and keep.json()["rows_held"] is True  # the sampler holds its rows too
        done = []
        workers = [
            threading.Thread(target=lambda: done.append(generate(gateway, PROBE, max_tokens=2)))
            for _ in range(HELD_BY_PAUSE)
        ]
        for worker in workers:
            worker.start()
        time.sleep(1.0)
        assert done == []  # held while paused
        # the admin routes still answer with every held call waiting: a weight update (here
        # one refused at once: nothing is published) and the resume (a deadlock otherwise)
        assert requests.get(f"{base}/health", timeout=10).json()["paused"] is True
        assert "cortex_recipes:paused 1" in requests.get(f"{base}/metrics", timeout=10).text
        update = requests.post(
            f"{base}/update_weights",
            json={"weight_dir": str(broadcasts.version_dir(tmp_path, 1))},
            timeout=10,
        )
        assert update.status_code == 404
        assert requests.post(f"{base}/resume", timeout=10).ok
        for worker in workers:
            worker.join(120)
        assert len(done) == HELD_BY_PAUSE


def test_update_weights_refuses_what_it_cannot_name_exactly(client, job, tmp_path):
    _, gateway = serve(client, job, tmp_path)
    with gateway:
        base = root(gateway)
        bad = requests.post(f"{base}/update_weights", json={"weight_dir": "/tmp/weights"})
        assert bad.status_code == 400 and "step_<v>" in bad.json()["error"]
        missing = requests.post(f"{base}/update_weights", json={"weight_dir": None})
        assert missing.status_code == 400 and "weight_dir=None" in missing.json()["error"]
        unpublished = update_weights(gateway, tmp_path, 4)
        assert unpublished.status_code == 404 and "not published" in unpublished.json()["error"]


def test_sampler_gets_exactly_each_version_even_when_the_next_batch_arrives_first(
    client, job, tmp_path
):
    """The hazard: batch 2 lands before version 1 is applied. The trainer must not step (so a
    late sync cannot copy v2 as v1), the sync of v1 must equal a fresh sampler loaded from v1's
    checkpoint, a retried v1 update is a no-op, and a sync for a version no longer live is 409."""
    adapter, gateway = serve(client, job, tmp_path)
    trainer = TrainerAdapter(
        client,
        TrainerAdapterConfig(output_dir=tmp_path, job_id=job, max_steps=2, pad_id=0, poll_s=0.05),
    )
    with gateway:
        base_ids, base_lps = probe(gateway)
        failures = []
        thread = threading.Thread(
            target=lambda: _capture(failures, trainer.run), name="trainer-adapter"
        )
        thread.start()
        rollout_file(gateway, tmp_path, 1, seed=10)
        broadcasts.wait_for(
            lambda: broadcasts.published_versions(tmp_path) == [0, 1] or failures,
            timeout_s=120, poll_s=0.05, what="version 1",
        )  # fmt: skip
        assert not failures, failures
        rollout_file(gateway, tmp_path, 2, seed=20)  # batch 2 before v1 is applied
        time.sleep(1.5)
        assert broadcasts.published_versions(tmp_path) == [0, 1]
        assert broadcasts.read_live(tmp_path)["version"] == 1
        assert broadcasts.read_live(tmp_path)["state"] == "stable"

        applied = update_weights(gateway, tmp_path, 1)
        assert applied.status_code == 200 and applied.json() == {"version": 1, "synced": True}
        v1_ids, v1_lps = probe(gateway)
        thread.join(timeout=120)
        assert not failures, failures
        assert broadcasts.published_versions(tmp_path) == [0, 1, 2]

        retried = update_weights(gateway, tmp_path, 1)  # prime-rl retries admin calls
        assert retried.json() == {"version": 1, "synced": False}
        assert probe(gateway) == (v1_ids, v1_lps)
        adapter.version = 0  # a sampler that lost track, asked for v1 while v2 is live
        late = update_weights(gateway, tmp_path, 1)
        assert late.status_code == 409 and "holds version 2" in late.json()["error"]
        assert update_weights(gateway, tmp_path, 2).json() == {"version": 2, "synced": True}
        v2_lps = probe(gateway)[1]

    assert v1_lps != base_lps and v2_lps != v1_lps  # each step changed the weights
    version_1 = broadcasts.version_dir(tmp_path, 1)
    fresh_ids, fresh_lps = fresh_probe(client, job, version_1, tmp_path / "fresh")
    assert fresh_ids == v1_ids
    assert fresh_lps == pytest.approx(v1_lps, abs=1e-5)
    records = [
        json.loads(x)
        for x in (tmp_path / "cortex" / "trainer_metrics.jsonl").read_text().splitlines()
    ]
    assert [r["policy_version"] for r in records] == [1, 2]
    assert records[1]["time/wait_for_sync"] >= 0.0


def _capture(failures, fn):
    try:
        fn()
    except BaseException as exc:  # noqa: BLE001 - reported by the test thread
        failures.append(repr(exc))


def test_trainer_adapter_resumes_from_its_last_published_version_after_kill_9(
    backend, client, job, tmp_path
):
    connection = tmp_path / "connection.json"
    connection.write_text(
        json.dumps(
            {"base_url": backend.base_url, "database": backend.database, "schema": backend.schema}
        )
    )
    out = tmp_path / "run"
    command = [
        sys.executable, "-m", "cortex_recipes.primerl.trainer", "--connection", str(connection),
        "--job-id", job, "--output-dir", str(out), "--max-steps", "2", "--pad-id", "0",
    ]  # fmt: skip
    _, gateway = serve(client, job, out)
    with gateway:
        first = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            rollout_file(gateway, out, 1, seed=30)
            broadcasts.wait_for(
                lambda: broadcasts.published_versions(out) == [0, 1] or first.poll() is not None,
                timeout_s=180, poll_s=0.1, what="version 1",
            )  # fmt: skip
            assert first.poll() is None, first.stderr.read().decode()
        finally:
            first.kill()  # SIGKILL while it waits for batch 2
            first.wait()
        v1 = broadcasts.read_manifest(broadcasts.version_dir(out, 1))
        assert update_weights(gateway, out, 1).json()["synced"] is True
        rollout_file(gateway, out, 2, seed=40)
        second = subprocess.run(command, capture_output=True, text=True, timeout=300)
        assert second.returncode == 0, second.stderr
        assert f"resumed at version 1 from checkpoint {v1['checkpoint_id']}" in second.stderr
    assert broadcasts.published_versions(out) == [0, 1, 2]
    steps = [
        json.loads(x)["step"]
        for x in (out / "cortex" / "trainer_metrics.jsonl").read_text().splitlines()
    ]
    assert steps == [1, 2]


def test_trainer_adapter_stops_on_an_undecodable_rollout_file(client, job, tmp_path):
    trainer = TrainerAdapter(
        client,
        TrainerAdapterConfig(output_dir=tmp_path, job_id=job, max_steps=1, pad_id=0, poll_s=0.05),
    )
    path = rollout_path(tmp_path, 1)
    path.parent.mkdir(parents=True)
    fields = [[1, 2], "mask?", [0.0, 0.0], [0.0, 0.0], [0, 1], [2], [1.0, 1.0], ["e", "e"], [2]]
    path.write_bytes(msgspec.msgpack.encode([fields]))
    with pytest.raises(ValueError, match=r"step_1/rank_0.bin.*field loss_mask"):
        trainer.run()
    assert broadcasts.published_versions(tmp_path) == [0]
    assert Path(tmp_path / "cortex" / broadcasts.LIVE).is_file()


DATA = (
    Path(__file__).resolve().parents[2]
    / "recipes"
    / "rl"
    / "async_grpo"
    / "primerl"
    / "recorded"
    / "rollouts"
)


def test_trainer_adapter_trains_on_prime_rl_rollout_files(client, job, tmp_path):
    """Files recorded from a real prime-rl run (recipes/rl/async_grpo/primerl/recorded) train two steps."""
    import shutil

    shutil.copytree(DATA, tmp_path / "rollouts")
    _, gateway = serve(client, job, tmp_path)
    trainer = TrainerAdapter(
        client,
        TrainerAdapterConfig(output_dir=tmp_path, job_id=job, max_steps=2, pad_id=0, poll_s=0.05),
    )
    with gateway:
        assert trainer.start() == 0
        first = trainer.train_step(1)
        assert update_weights(gateway, tmp_path, 1).json() == {"version": 1, "synced": True}
        second = trainer.train_step(2)
    assert [first["samples"], second["samples"]] == [4, 4]
    assert first["trainable_tokens"] > 0 and first["loss"] is not None
    assert broadcasts.published_versions(tmp_path) == [0, 1, 2]


LORA = {"r": 8, "lora_alpha": 16, "target_modules": ["q_proj", "v_proj"]}


def test_load_lora_adapter_gives_the_sampler_exactly_the_published_lora_version(client, tmp_path):
    """prime-rl's LoRA mode updates the server with ``/load_lora_adapter`` (``lora_name``,
    ``lora_path`` = the version's broadcast folder) instead of ``/update_weights``: the sampler
    must then hold exactly that version's adapter (checked against a fresh LoRA sampler loaded
    from its checkpoint), the name is served in ``/v1/models``, and a bad call is refused."""
    job = start(client, [training(lr=5e-2, lora=LORA), inference(lora=LORA)])
    try:
        adapter = InferenceAdapter(
            client, job, model=TINY, max_model_len=MAX_MODEL_LEN, output_dir=tmp_path,
            weight_format="lora",
        )  # fmt: skip
        gateway = Gateway(adapter.app)
        trainer = TrainerAdapter(
            client,
            TrainerAdapterConfig(
                output_dir=tmp_path, job_id=job, max_steps=1, pad_id=0, poll_s=0.05
            ),
        )
        with gateway:
            base = root(gateway)
            base_ids, base_lps = probe(gateway)
            assert trainer.start() == 0
            rollout_file(gateway, tmp_path, 1, seed=10)
            trainer.train_step(1)
            bad = requests.post(f"{base}/load_lora_adapter", json={"lora_path": "x"}, timeout=60)
            assert bad.status_code == 400 and "lora_name=None" in bad.json()["error"]
            weight_dir = broadcasts.version_dir(tmp_path, 1)
            assert requests.post(f"{base}/pause", params={"mode": "keep"}).ok
            try:
                (weight_dir / "NCCL_READY").touch()
                loaded = requests.post(
                    f"{base}/load_lora_adapter",
                    json={"lora_name": "r-1", "lora_path": str(weight_dir)},
                    timeout=300,
                )
            finally:
                assert requests.post(f"{base}/resume").ok
            assert loaded.status_code == 200 and loaded.json() == {"version": 1, "synced": True}
            models = requests.get(f"{base}/v1/models", timeout=60).json()["data"]
            assert "r-1" in [m["id"] for m in models]
            v1_ids, v1_lps = probe(gateway)
        assert v1_lps != base_lps
        fresh_ids, fresh_lps = fresh_probe(client, job, weight_dir, tmp_path / "fresh", LORA)
        assert fresh_ids == v1_ids
        assert fresh_lps == pytest.approx(v1_lps, abs=1e-5)
    finally:
        client.cancel_job(job)
