"""GRPO building blocks: profiles, the math environment, advantages, frames, checkpoints."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from cortex_training import wire

from cortex_recipes.envs.math import MathEnv, MathEnvError, extract_answer
from cortex_recipes.profiles import ProfileError
from cortex_recipes.rl.grpo import ScoredGroup, group_advantages, group_seed, grpo_frame, task_order
from cortex_recipes.rl.grpo_profile import load_grpo_profile
from cortex_recipes.rollouts import Rollout, rollouts_from_results
from tests import extras

pytestmark = pytest.mark.contract

ROOT = Path(__file__).resolve().parents[2]
PROFILES = sorted((ROOT / "recipes/rl").glob("*/configs/*.json"))
ADDITION = {
    "min_terms": 2,
    "max_terms": 2,
    "min_digits": 1,
    "max_digits": 1,
    "operators": ["+"],
    "allow_parentheses": False,
    "allow_negation": False,
}


@pytest.mark.parametrize("path", PROFILES, ids=lambda p: f"{p.parent.parent.name}/{p.stem}")
def test_checked_in_profiles_build_sub_jobs_the_sdk_accepts(path):
    profile = load_grpo_profile(path)
    assert profile.is_async == (path.parent.parent.name == "async_grpo")
    training, sampling = profile.sub_jobs()
    for sub_job in (training, sampling):
        sub_job.validate()
    wire_training = training.to_wire()
    assert wire_training["job_type"] == "training"
    assert profile.orchestrator.batch_size == profile.groups_per_step * profile.group_size
    if profile.is_async:  # prime-rl's lag bound, and the in-flight groups it runs
        assert profile.orchestrator.max_off_policy_steps >= 1
        assert profile.orchestrator.max_inflight_groups >= 1


def _write(tmp_path, raw) -> Path:
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(raw))
    return path


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda r: r["orchestrator"].update(batch_size=60), "multiple of orchestrator.group_size"),
        (lambda r: r["orchestrator"].update(group_size=1), "group_size=1 must be >= 2"),
        (lambda r: r["orchestrator"].update(max_off_policy_steps=-1), "max_off_policy_steps=-1"),
        (
            lambda r: r["orchestrator"].pop("max_off_policy_steps"),
            "max_inflight_groups=8 is an async setting",
        ),
        (lambda r: r["orchestrator"].update(max_inflight_groups=0), "max_inflight_groups=0"),
        # prime-rl 559b447 has no max_async_level; a profile that sets one is refused
        (
            lambda r: r["orchestrator"].update(max_async_level=1),
            "unknown keys \\['max_async_level'\\]",
        ),
        (lambda r: r["orchestrator"].update(speed=3), "unknown keys \\['speed'\\]"),
        (lambda r: r["env"].update(latency_s=-1), "env.latency_s=-1"),
        (lambda r: r.update(weight_format="vllm"), "weight_format='vllm'"),
        (lambda r: r.pop("training"), "needs training.peft_config"),
        (lambda r: r["ckpt"].update(interval=0), "ckpt.interval=0"),
        (lambda r: r.update(steps=0), "steps=0"),
    ],
)
def test_bad_profiles_are_rejected_naming_the_field(tmp_path, change, message):
    raw = json.loads(
        (ROOT / "recipes/rl/async_grpo/configs/local-cpu-smollm2-lora.json").read_text()
    )
    change(raw)
    with pytest.raises(ProfileError, match=message):
        load_grpo_profile(_write(tmp_path, raw))


@extras.requires("grpo")
def test_math_env_is_seeded_and_scored_by_reasoning_gym():
    a = MathEnv("basic_arithmetic", seed=3, size=20, config=ADDITION)
    b = MathEnv("basic_arithmetic", seed=3, size=20, config=ADDITION)
    assert [a.task(i).question for i in range(20)] == [b.task(i).question for i in range(20)]
    task = a.task(0)
    x, y = (int(t) for t in task.question.removeprefix("Calculate ").rstrip(".").split(" + "))
    assert task.answer == str(x + y)
    assert a.prompt(task).endswith("Answer with just the number.")
    assert a.score(task, f" {x + y}") == 1.0
    assert a.score(task, f"The answer is {x + y}. So") == 1.0
    assert a.score(task, "I do not know") == 0.0
    assert a.score(task, str(x + y + 1)) < 1.0
    assert extract_answer("minus -7 then 3") == "-7"


@extras.requires("grpo")
def test_math_env_rejects_a_bad_generator_config():
    with pytest.raises(MathEnvError, match="basic_arithmetic"):
        MathEnv("basic_arithmetic", seed=0, size=4, config={"operators": ["^"]})


def test_group_advantages_are_reward_minus_group_mean():
    assert group_advantages([1.0, 0.0, 0.0, 1.0]) == [0.5, -0.5, -0.5, 0.5]
    assert group_advantages([1.0, 1.0]) == [0.0, 0.0]


def test_seeds_and_task_order_are_fixed_and_disjoint():
    assert task_order(0, 10) == task_order(0, 10) != task_order(1, 10)
    assert sorted(task_order(0, 10)) == list(range(10))
    seeds = [group_seed(0, g, 8) + i for g in range(5) for i in range(8)]
    assert len(set(seeds)) == len(seeds)


def test_grpo_frame_places_advantages_and_sampler_logprobs_on_sampled_tokens():
    groups = [
        ScoredGroup(
            0,
            [Rollout([5, 6, 7], [8, 9], [-0.5, -0.25]), Rollout([5, 6, 7], [10], [-1.0])],
            [1.0, 0.0],
        ),
        ScoredGroup(
            1, [Rollout([3], [4, 4, 4], [-0.1, -0.2, -0.3]), Rollout([3], [2], [-2.0])], [0.0, 0.0]
        ),
    ]
    frame, stats = grpo_frame(groups, pad_id=0, loss_config={"eps_clip": 0.3})
    decoded = wire.loads(frame)
    ids, ctx = decoded["kwargs"]["input_ids"], decoded["context"]
    assert ids.tolist() == [[5, 6, 7, 8, 9], [5, 6, 7, 10, 0], [3, 4, 4, 4, 0], [3, 2, 0, 0, 0]]
    assert ctx["loss_mask"].tolist() == [
        [0, 0, 1, 1, 0],
        [0, 0, 1, 0, 0],
        [1, 1, 1, 0, 0],
        [1, 0, 0, 0, 0],
    ]
    assert ctx["advantages"][0].tolist() == [0, 0, 0.5, 0.5, 0]
    assert ctx["advantages"][1].tolist() == [0, 0, -0.5, 0, 0]
    assert not ctx["advantages"][2:].any()
    assert torch.allclose(ctx["old_log_probs_shifted"][0], torch.tensor([0, 0, -0.5, -0.25, 0]))
    assert decoded["processing"] == {
        "loss_fn": "grpo",
        "config": {"eps_clip": 0.3, "loss_agg_mode": "token-mean"},
    }
    assert stats["reward/mean"] == 0.25 and stats["groups/uniform_fraction"] == 0.5
    assert stats["progress/output_tokens"] == 7


def test_rollouts_need_one_logprob_per_sampled_token():
    ok = rollouts_from_results(
        [[1]],
        [{"token_ids": [7, 8], "logprobs": [{"7": {"logprob": -1.0}}, {"8": {"logprob": -2.0}}]}],
    )
    assert ok[0].sampler_logprobs == [-1.0, -2.0]
    with pytest.raises(ValueError, match="logprobs=0"):
        rollouts_from_results(
            [[1]], [{"token_ids": [7, 8], "logprobs": [{"7": {"logprob": -1.0}}]}]
        )
