"""One local backend per test session, started the way journeys start it (child process)."""

from __future__ import annotations

import pytest
from cortex_training import JobType, SubJobConfig

from cortex_recipes.local import LocalBackend

TINY = "tiny-qwen3"
SMALL_BODY_LIMIT = 2 * 1024 * 1024
# Small, so that any result over 12 KiB travels as paged result_chunk events (the SDK reserves
# 8 KiB of each chunk frame for its header, leaving 4 KiB payload chunks).
SMALL_RESULT_CHUNK = 12 * 1024


@pytest.fixture(scope="session")
def backend(tmp_path_factory):
    state = tmp_path_factory.mktemp("local-backend")
    with LocalBackend(
        state, threads=1, max_body_bytes=SMALL_BODY_LIMIT, result_chunk_bytes=SMALL_RESULT_CHUNK
    ) as running:
        yield running


@pytest.fixture(scope="session")
def client(backend):
    # No retries: 404 and 409 are "transient" to the SDK, and these tests want the first answer.
    return backend.client(
        max_retries=0, poll_interval=0.02, poll_max_interval=0.2, poll_timeout=300
    )


def training(model=TINY, *, lr=1e-3, lora=None, clip=None, seed=0, source=None, n_gpus=1):
    extra = {"peft_config": lora} if lora else None
    return SubJobConfig.training_job(
        model,
        optimizer={"name": "AdamW", "lr": lr, "weight_decay": 0.0},
        max_seq_len=256,
        train_batch_size=2,
        n_gpus=n_gpus,
        gradient_clipping=clip,
        extra_training=extra,
        seed=seed,
        source_checkpoint_info=source,
    )


def inference(model=TINY, *, kind=JobType.SAMPLING, lora=None, seed=0, source=None):
    return SubJobConfig.sampling_job(
        model,
        max_seq_len=256,
        n_gpus=1,
        job_type=kind,
        extra_sampling={"peft_config": lora} if lora else None,
        seed=seed,
        source_checkpoint_info=source,
    )


def start(client, sub_jobs) -> str:
    job_id = client.create_job(sub_jobs)
    client.wait_for_job(job_id)
    return job_id
