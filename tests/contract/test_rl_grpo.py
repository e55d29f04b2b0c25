"""GRPO building blocks: profiles, the math environment, advantages, frames, checkpoints."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import requests
import torch
from cortex_training import wire

from cortex_recipes.envs.math import MathEnv, MathEnvError, extract_answer
from cortex_recipes.reconnect import is_recoverable
from cortex_recipes.rl.checkpoint import CheckpointError, RunCheckpoints
from cortex_recipes.rl.grpo import ScoredGroup, group_advantages, group_seed, grpo_frame, task_order
from cortex_recipes.rl.orchestrator import Intervals, overlap_seconds
from cortex_recipes.rl.profile import load_grpo_profile
from cortex_recipes.rollouts import Rollout, rollouts_from_results
from cortex_recipes.run_log import RunLog
from cortex_recipes.sft import ProfileError

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
    assert profile.orchestrator["batch_size"] == profile.groups_per_step * profile.group_size
    if profile.is_async:
        config = profile.lag_config()
        assert config.max_off_policy_steps >= config.max_async_level


def _write(tmp_path, raw) -> Path:
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(raw))
    return path


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda r: r["orchestrator"].update(batch_size=60), "multiple of orchestrator.group_size"),
        (lambda r: r["orchestrator"].update(group_size=1), "group_size=1 must be >= 2"),
        (lambda r: r["orchestrator"].update(max_off_policy_steps=0), "max_off_policy_steps=0"),
        (lambda r: r["orchestrator"].pop("max_off_policy_steps"), "sets both"),
        (lambda r: r["orchestrator"].update(max_async_level=-1), "max_async_level=-1"),
        (lambda r: r["orchestrator"].update(speed=3), "unknown keys \\['speed'\\]"),
        (lambda r: r["env"].update(latency_s=-1), "env.latency_s=-1"),
        (lambda r: r.update(weight_format="vllm"), "weight_format='vllm'"),
        (lambda r: r["trainer"].pop("training"), "needs trainer.training.peft_config"),
        (lambda r: r["ckpt"].update(interval=0), "ckpt.interval=0"),
        (lambda r: r.update(max_steps=0), "max_steps=0"),
    ],
)
def test_bad_profiles_are_rejected_naming_the_field(tmp_path, change, message):
    raw = json.loads(
        (ROOT / "recipes/rl/async_grpo/configs/local-cpu-smollm2-lora.json").read_text()
    )
    change(raw)
    with pytest.raises(ProfileError, match=message):
        load_grpo_profile(_write(tmp_path, raw))


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


def test_overlap_of_interval_sets():
    a, b = Intervals(), Intervals()
    for span in [(0, 2), (5, 8), (1, 3)]:
        a.add(*span)
    for span in [(2.5, 6), (7, 10)]:
        b.add(*span)
    assert a.total() == 6
    assert overlap_seconds(a, b) == pytest.approx(0.5 + 1 + 1)
    assert overlap_seconds(a, Intervals()) == 0


def test_checkpoints_are_atomic_and_incomplete_ones_ignored(tmp_path):
    store = RunCheckpoints(tmp_path / "checkpoints")
    assert store.latest() is None
    trainer = {"job_id": "job-1", "checkpoint_id": "cp_1"}
    store.save(2, {"trainer": trainer})
    store.save(4, {"trainer": trainer})
    (tmp_path / "checkpoints/step_6").mkdir()  # crashed mid-save: no orchestrator.json
    (tmp_path / "checkpoints/step_6/.orchestrator.json.tmp").write_text("{")
    assert store.steps() == [2, 4]
    assert store.latest()["step"] == 4
    (tmp_path / "checkpoints/step_4/orchestrator.json").write_text(json.dumps({"step": 4}))
    with pytest.raises(CheckpointError, match="trainer"):
        store.latest()


def test_resumed_run_log_keeps_steps_up_to_the_checkpoint(tmp_path):
    run = RunLog(tmp_path)
    for step in range(1, 6):
        run.metrics(step=step)
    resumed = RunLog(tmp_path, keep_through_step=3)
    resumed.metrics(step=4)
    assert [m["step"] for m in resumed.read_metrics()] == [1, 2, 3, 4]
    assert [m["step"] for m in RunLog(tmp_path).read_metrics()] == []


def _http_error(status: int) -> requests.HTTPError:
    response = requests.Response()
    response.status_code = status
    return requests.HTTPError(f"{status}", response=response)


def test_recoverable_errors_are_lost_backends_not_bad_requests():
    assert is_recoverable(requests.ConnectionError("refused"))
    assert is_recoverable(_http_error(503)) and is_recoverable(_http_error(404))
    assert not is_recoverable(_http_error(400))
    assert not is_recoverable(ValueError("bad field"))
    try:
        try:
            raise requests.ConnectionError("reset")
        except requests.ConnectionError as inner:
            raise RuntimeError("a rollout worker failed") from inner
    except RuntimeError as outer:
        assert is_recoverable(outer)
