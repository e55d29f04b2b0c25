"""Each journey's hosted profile, end to end against the local backend in hosted-conformance
mode (``connection=local-hosted``), with a small model and sizes substituted by overrides.

The hosted profiles (``configs/cortex-*.json``) name Qwen3 models and 8 GPUs per sub-job and are
not run here as written (no Cortex account, no GPUs); what runs here is the journey's hosted
code path: the same calls, answered as hosted Cortex documents it answers them (every rule of
cortex_recipes.local.hosted: save results without ids, logprobs outside post_process_outputs,
float sampler logprobs, PAT headers, hosted job states, ...), on two data-parallel ranks
(``n_gpus=2``, simulated on one device) so that rows are sharded, per-rank losses averaged and
a one-row forward refused unless the journey pads it. The async GRPO journey needs prime-rl's
environment and is checked where it is installed.
"""

from __future__ import annotations

import os

import pytest

from cortex_recipes.primerl.launch import ENV_VAR as PRIMERL_ENV
from tests import extras
from tests.e2e.conftest import TINY
from tests.e2e.hosted import hosted_mode_ran, metrics, run_hosted

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

# Two ranks: the smallest count that shards rows; every batch below is a multiple of it.
SMALL = ("n_gpus=2", "dtype=float32")


@extras.requires("sft")
def test_sft_hosted_profile(tmp_path):
    summary = run_hosted(
        "sft/conversational",
        "cortex-qwen3-8b-lora.json",
        tmp_path,
        steps=1,
        overrides=(f"model={TINY}", *SMALL, "batch_size=2", "max_seq_len=256"),
    )
    assert [m["step"] for m in metrics(tmp_path)] == [1]
    assert summary["checkpoint_id"].startswith("cp_") and "eval_after" in summary
    assert hosted_mode_ran(tmp_path)


@extras.requires("opd")
def test_opd_hosted_profile(tmp_path):
    summary = run_hosted(
        "distillation/on_policy",
        "cortex-qwen3-8b-to-1.7b.json",
        tmp_path,
        steps=1,
        overrides=(
            f"model={TINY}",
            f"teacher_model={TINY}",
            *SMALL,
            "rollouts_per_step=4",
            "max_tokens=8",
            "max_seq_len=256",
        ),  # fmt: skip
    )
    [step] = metrics(tmp_path)
    assert step["teacher_term_token_count"] == step["sampled_tokens"] > 0
    assert summary["teacher_frozen"] is True and hosted_mode_ran(tmp_path)


@extras.requires("grpo")
def test_math_grpo_hosted_profile(tmp_path):
    run_hosted(
        "rl/math_grpo",
        "cortex-qwen3-8b-lora.json",
        tmp_path,
        steps=1,
        overrides=(
            f"model={TINY}",
            *SMALL,
            "orchestrator.batch_size=8",
            "orchestrator.group_size=4",
            "orchestrator.sampling.max_tokens=8",
            "eval.num_examples=4",
        ),  # fmt: skip
    )
    assert [m["step"] for m in metrics(tmp_path)] == [1]
    assert hosted_mode_ran(tmp_path)


@extras.requires("tito")
def test_tito_hosted_profile(tmp_path):
    run_hosted(
        "agentic/tito",
        "cortex-qwen3-8b-chain.json",
        tmp_path,
        warm_start_steps=1,
        steps=1,
        overrides=(
            f"model={TINY}",
            *SMALL,
            "warm_start.batch_size=2",
            "rl.tasks_per_step=2",
            "rl.group_size=2",
            "rl.max_tokens=16",
        ),  # fmt: skip
    )
    assert any(m.get("step") == 1 for m in metrics(tmp_path))
    assert hosted_mode_ran(tmp_path)


@extras.requires("grpo")
@pytest.mark.skipif(
    not os.environ.get(PRIMERL_ENV), reason=f"no prime-rl environment: set {PRIMERL_ENV}"
)
def test_async_grpo_hosted_profile(tmp_path):
    """prime-rl's orchestrator driving the hosted profile's calls: its trainer adapter fits
    frames to the ranks, its inference adapter resets the prefix cache without draining."""
    summary = run_hosted(
        "rl/async_grpo",
        "cortex-qwen3-8b-lora.json",
        tmp_path,
        steps=2,
        overrides=(
            f"model={TINY}",
            *SMALL,
            "orchestrator.batch_size=8",
            "orchestrator.group_size=4",
            "orchestrator.max_inflight_groups=2",
            "orchestrator.sampling.max_tokens=8",
            "eval.num_examples=4",
        ),  # fmt: skip
    )
    assert summary["orchestrator"] == "prime-rl" and summary["steps"] == [1, 2]
    assert [m["step"] for m in metrics(tmp_path)] == [1, 2]
    assert hosted_mode_ran(tmp_path)
