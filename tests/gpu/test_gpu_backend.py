"""The local backend on a CUDA device, through the real SDK over HTTP on 127.0.0.1.

The GPU tests run only where ``torch.cuda.is_available()``; elsewhere they are skipped with
that reason (``bench/gpu_check.sh`` runs this module on a GPU machine). The two tests at the
bottom are their complement and run only where CUDA is absent.

Every GPU-vs-CPU comparison sends the same float32 frame to a ``LocalBackend(device="cuda")``
and a ``LocalBackend(device="cpu")`` and compares what comes back. The tolerances:

- ``LOSS_ATOL`` (1e-4) on a loss near 12 (tiny-qwen3 is random-init, so every next-token
  logprob is near -log(151936) = -11.93) and on per-token logprobs: float32 matmuls reduce in
  a different order on the GPU, which moves the fifth significant digit at most.
- ``STEPPED_ATOL`` (1e-3) on the loss after one AdamW step: the first Adam update is about
  ``lr * g / (|g| + eps)`` per weight, smooth in ``g``, so the gradient differences above move
  the next loss by a little more than they move the first.
- ``DECODE_ATOL`` (2e-4) between the sampler's logprobs (KV-cache decode, one token at a
  time) and the trainer's full forward over the same ids: both float32, different kernels.
- ``BF16_ATOL`` (0.05) between a bfloat16 and a float32 sub-job scoring the same ids: bf16
  keeps 8 mantissa bits, so logits near 1 move by about 0.004 each and a logprob near -12 by a
  few hundredths.
"""

from __future__ import annotations

import time

import pytest
import requests
import torch
from cortex_training import JobType, SubJobConfig, wire

from cortex_recipes.local import LocalBackend

pytestmark = pytest.mark.e2e

CUDA = torch.cuda.is_available()


def needs_cuda(test):
    """A ``gpu`` test: skipped with a reason where CUDA is absent."""
    skip = pytest.mark.skipif(
        not CUDA, reason="needs a CUDA device: torch.cuda.is_available() is False here"
    )
    return pytest.mark.gpu(skip(test))


needs_no_cuda = pytest.mark.skipif(CUDA, reason="checks what happens where CUDA is absent")

TINY = "tiny-qwen3"
MAX_SEQ_LEN = 256
LOSS_ATOL = 1e-4
STEPPED_ATOL = 1e-3
DECODE_ATOL = 2e-4
BF16_ATOL = 0.05
# A worker's CUDA context alone takes a few hundred MiB; 64 MiB is well below what a live
# tiny-qwen3 trainer holds and well above what the allocator of this test process moves.
MEMORY_SLACK = 64 * 1024**2
CE = {"loss_fn": "causal_cross_entropy", "post": ["compute_logprobs"], "config": {}}
GRPO = {"eps_clip": 0.2, "eps_clip_higher": 0.28}


def training(*, dtype: str | None = "float32", lr: float = 1e-3) -> SubJobConfig:
    return SubJobConfig.training_job(
        TINY,
        optimizer={"name": "AdamW", "lr": lr, "weight_decay": 0.0},
        max_seq_len=MAX_SEQ_LEN,
        train_batch_size=4,
        n_gpus=1,
        dtype=dtype,
        seed=0,
    )


def inference(*, kind: JobType = JobType.SAMPLING, dtype: str | None = "float32") -> SubJobConfig:
    return SubJobConfig.sampling_job(
        TINY, max_seq_len=MAX_SEQ_LEN, n_gpus=1, job_type=kind, dtype=dtype, seed=0
    )


def backend_client(backend: LocalBackend):
    # No retries: these tests want the first answer.
    return backend.client(
        max_retries=0, poll_interval=0.01, poll_max_interval=0.1, poll_timeout=300
    )


def start(client, sub_jobs: list[SubJobConfig]) -> str:
    job_id = client.create_job(sub_jobs)
    client.wait_for_job(job_id)
    return job_id


def run(client, job_id: str, request_id: str) -> dict:
    return client.poll_request(job_id, request_id)


def batch(seed: int, rows: int, length: int) -> torch.Tensor:
    return torch.randint(10, 5000, (rows, length), generator=torch.Generator().manual_seed(seed))


def sampled_logprobs(out: dict) -> torch.Tensor:
    return torch.tensor([float(next(iter(e.values()))["logprob"]) for e in out["logprobs"]])


def scored(client, job_id: str, ids: torch.Tensor, sub_job_type: str) -> torch.Tensor:
    """No-grad logprobs of ``ids`` ([B, T], prediction-aligned) from one sub-job."""
    frame = wire.dumps(
        {"args": (), "kwargs": {"input_ids": ids}, "processing": {"post": ["compute_logprobs"]}}
    )
    request = client.forward(job_id, frame, sub_job_type=sub_job_type)["request_id"]
    return run(client, job_id, request)["post_process_outputs"]["logprobs"]


def sft_frame(ids: torch.Tensor, weights: torch.Tensor | None = None) -> bytes:
    """A causal_cross_entropy frame over ``ids`` with per-token ``weights`` (default 1) as its
    loss mask; the last column, which has no next token, is masked out."""
    mask = torch.ones(ids.shape) if weights is None else weights
    mask[:, -1] = 0.0
    return wire.dumps(
        {
            "args": (),
            "kwargs": {"input_ids": ids},
            "context": {"input_ids": ids, "loss_mask": mask},
            "processing": CE,
        }
    )


def fb_and_step(client, job_id: str, frame: bytes) -> tuple[dict, dict]:
    result = run(client, job_id, client.forward_backward(job_id, frame))
    return result, run(client, job_id, client.step(job_id))


# -- GPU ------------------------------------------------------------------------------------


def serving(tmp_path_factory, device: str):
    """A client of a ``LocalBackend(device=device)`` for the module's fixtures (closed after)."""
    with LocalBackend(tmp_path_factory.mktemp(f"{device}-backend"), device=device) as backend:
        client = backend_client(backend)
        yield client
        client.close()


@pytest.fixture(scope="module")
def gpu_client(tmp_path_factory):
    yield from serving(tmp_path_factory, "cuda")


@pytest.fixture(scope="module")
def cpu_client(tmp_path_factory):
    yield from serving(tmp_path_factory, "cpu")


@pytest.fixture(scope="module")
def gpu_job(gpu_client):
    """Trainer and sampler in float32, a log-probability sub-job in the device's default."""
    return start(
        gpu_client, [training(), inference(), inference(kind=JobType.LOG_PROBABILITY, dtype=None)]
    )


@needs_cuda
def test_get_job_reports_cuda_and_each_sub_jobs_dtype(gpu_client, gpu_job):
    sub_jobs = {s["job_type"]: s for s in gpu_client.get_job(gpu_job)["sub_jobs"]}
    assert {t: s["device"] for t, s in sub_jobs.items()} == {
        "training": "cuda:0",
        "sampling": "cuda:0",
        "log_probability": "cuda:0",
    }
    # An explicit dtype is honoured; without one a CUDA sub-job runs in bfloat16.
    assert sub_jobs["training"]["dtype"] == sub_jobs["sampling"]["dtype"] == "float32"
    assert sub_jobs["log_probability"]["dtype"] == "bfloat16"


@needs_cuda
def test_sft_and_grpo_steps_on_cuda_match_the_cpu_backend(gpu_client, cpu_client):
    """One causal_cross_entropy step, then one grpo step on rollouts the GPU sampler drew."""
    gpu = start(gpu_client, [training(), inference()])
    cpu = start(cpu_client, [training()])

    ids = batch(1, rows=4, length=128)
    sft = sft_frame(ids, torch.rand(ids.shape, generator=torch.Generator().manual_seed(2)))
    on_gpu, gpu_step = fb_and_step(gpu_client, gpu, sft)
    on_cpu, cpu_step = fb_and_step(cpu_client, cpu, sft)
    assert on_gpu["avg_loss"] == pytest.approx(on_cpu["avg_loss"], abs=LOSS_ATOL)
    assert torch.allclose(
        on_gpu["post_process_outputs"]["logprobs"],
        on_cpu["post_process_outputs"]["logprobs"],
        atol=LOSS_ATOL,
    )
    assert gpu_step["grad_norm"] == pytest.approx(cpu_step["grad_norm"], rel=1e-3)

    # GRPO: 4 rollouts of 16 tokens from the (not yet synced) GPU sampler, scored as old logprobs.
    prompts = batch(3, rows=4, length=16)
    params = {"max_tokens": 16, "temperature": 1.0, "seed": 5, "logprobs": 0, "ignore_eos": True}
    outs = run(gpu_client, gpu, gpu_client.generate(gpu, prompts.tolist(), params))["results"]
    completions = torch.tensor([o["token_ids"] for o in outs])
    rl_ids = torch.cat([prompts, completions], dim=1)
    old = torch.zeros(rl_ids.shape)
    mask = torch.zeros(rl_ids.shape)
    start_col = prompts.shape[1] - 1  # column i scores token i+1
    for row, out in enumerate(outs):
        old[row, start_col : start_col + 16] = sampled_logprobs(out)
        mask[row, start_col : start_col + 16] = 1.0
    advantages = torch.tensor([[1.0], [-1.0], [0.5], [-0.5]]).expand(rl_ids.shape).contiguous()
    grpo = wire.dumps(
        {
            "args": (),
            "kwargs": {"input_ids": rl_ids},
            "context": {
                "input_ids": rl_ids,
                "loss_mask": mask,
                "advantages": advantages,
                "old_log_probs_shifted": old,
            },
            "processing": {"loss_fn": "grpo", "post": ["compute_logprobs"], "config": GRPO},
        }
    )
    on_gpu, gpu_step = fb_and_step(gpu_client, gpu, grpo)
    on_cpu, cpu_step = fb_and_step(cpu_client, cpu, grpo)
    assert on_gpu["avg_loss"] == pytest.approx(on_cpu["avg_loss"], abs=STEPPED_ATOL)
    tokens = on_cpu["metrics"]["grpo_stats_token_count"]
    assert on_gpu["metrics"]["grpo_stats_token_count"] == tokens == mask.sum()
    # A token whose ratio sits on a clip edge may fall either side: one token of slack.
    assert on_gpu["metrics"]["clip_ratio"] == pytest.approx(
        on_cpu["metrics"]["clip_ratio"], abs=1.0 / float(tokens)
    )
    assert on_gpu["metrics"]["approx_kl"] == pytest.approx(
        on_cpu["metrics"]["approx_kl"], abs=STEPPED_ATOL
    )
    assert gpu_step["grad_norm"] == pytest.approx(cpu_step["grad_norm"], rel=1e-2)
    gpu_client.cancel_job(gpu)
    cpu_client.cancel_job(cpu)


@needs_cuda
def test_generate_with_logprobs_on_cuda_is_seeded_and_scored(gpu_client, gpu_job):
    prompt = batch(6, rows=1, length=12)[0].tolist()
    params = {"max_tokens": 8, "temperature": 1.0, "top_p": 0.9, "seed": 11, "logprobs": 0}
    first = run(gpu_client, gpu_job, gpu_client.generate(gpu_job, [prompt, prompt], params))
    again = run(gpu_client, gpu_job, gpu_client.generate(gpu_job, [prompt], params))
    rows = first["results"] + again["results"]
    assert rows[0]["token_ids"] == rows[1]["token_ids"] == rows[2]["token_ids"]
    out = rows[0]
    lp = sampled_logprobs(out)
    assert len(lp) == len(out["token_ids"]) > 0
    assert torch.isfinite(lp).all() and (lp <= 0).all()
    # The bfloat16 log-probability sub-job scores the same tokens close to the fp32 sampler.
    ids = torch.tensor([prompt + out["token_ids"]])
    teacher = scored(gpu_client, gpu_job, ids, "log_probability")[0]
    n = len(out["token_ids"])
    assert torch.allclose(teacher[len(prompt) - 1 : len(prompt) - 1 + n], lp, atol=BF16_ATOL)


@needs_cuda
def test_weight_sync_on_cuda_makes_the_sampler_match_the_trainer(gpu_client, gpu_job):
    prompt = batch(7, rows=1, length=12)[0].tolist()
    greedy = {"max_tokens": 6, "temperature": 0.0, "logprobs": 0}

    def sampler_and_trainer() -> tuple[torch.Tensor, torch.Tensor]:
        out = run(gpu_client, gpu_job, gpu_client.generate(gpu_job, [prompt], greedy))["results"]
        tokens = out[0]["token_ids"]
        trainer = scored(gpu_client, gpu_job, torch.tensor([prompt + tokens]), "training")[0]
        start_col = len(prompt) - 1
        return sampled_logprobs(out[0]), trainer[start_col : start_col + len(tokens)]

    frame = sft_frame(batch(8, rows=2, length=64))
    run(gpu_client, gpu_job, gpu_client.forward_backward(gpu_job, frame))
    run(gpu_client, gpu_job, gpu_client.step(gpu_job, learning_rate=1e-2))
    sampler, trainer = sampler_and_trainer()
    assert (sampler - trainer).abs().max() > 10 * DECODE_ATOL, "the step should move the trainer"

    sync = gpu_client.weight_sync(
        gpu_job, f"{gpu_job}:training:0", [f"{gpu_job}:sampling:0"], weight_format="hf"
    )
    run(gpu_client, gpu_job, sync)
    sampler, trainer = sampler_and_trainer()
    assert torch.allclose(sampler, trainer, atol=DECODE_ATOL)


def _free_gpu_bytes() -> int:
    return int(torch.cuda.mem_get_info()[0])


def _settled_free_gpu_bytes() -> int:
    """Free GPU memory once workers of jobs cancelled earlier have finished exiting."""
    deadline = time.monotonic() + 30
    last = _free_gpu_bytes()
    while time.monotonic() < deadline:
        time.sleep(0.5)
        now = _free_gpu_bytes()
        if abs(now - last) < 2**20:
            return now
        last = now
    return last


@needs_cuda
def test_cancelling_a_cuda_job_frees_its_gpu_memory(gpu_client):
    before = _settled_free_gpu_bytes()  # also creates this process's own CUDA context first
    job_id = start(gpu_client, [training()])
    frame = sft_frame(batch(9, rows=2, length=64))
    fb_and_step(gpu_client, job_id, frame)  # gradients and AdamW state exist too
    during = _free_gpu_bytes()
    assert before - during > MEMORY_SLACK, "the worker should hold GPU memory while it runs"

    gpu_client.cancel_job(job_id)
    # Workers are separate processes: their memory returns when they exit, shortly after the
    # cancel returns. Wait for it (a bounded wait, not a timing assertion).
    deadline = time.monotonic() + 60
    after = _free_gpu_bytes()
    while after < before - MEMORY_SLACK and time.monotonic() < deadline:
        time.sleep(0.5)
        after = _free_gpu_bytes()
    assert after >= before - MEMORY_SLACK, (
        f"{(before - after) / 2**20:.0f} MiB still held after cancel "
        f"(the job held {(before - during) / 2**20:.0f} MiB)"
    )
    assert gpu_client.get_job(job_id)["status"].lower() == "cancelled"


# -- where CUDA is absent -------------------------------------------------------------------


@needs_no_cuda
def test_asking_for_cuda_without_cuda_fails_job_creation_naming_the_device(tmp_path):
    with LocalBackend(tmp_path, device="cuda") as backend:
        client = backend_client(backend)
        with pytest.raises(requests.HTTPError) as info:
            client.create_job([training()])
        client.close()
    response = info.value.response
    assert response.status_code == 400 and "cuda" in response.json()["message"]


@needs_no_cuda
def test_cpu_sub_jobs_report_cpu_and_float32_by_default(tmp_path):
    with LocalBackend(tmp_path, device="auto", threads=1) as backend:
        client = backend_client(backend)
        job_id = start(client, [training(dtype=None)])
        sub_job = client.get_job(job_id)["sub_jobs"][0]
        client.cancel_job(job_id)
        client.close()
    assert (sub_job["device"], sub_job["dtype"]) == ("cpu", "float32")
