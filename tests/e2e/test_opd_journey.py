"""A short on-policy distillation run on the local backend (real student, real frozen teacher)."""

import json

import pytest

from recipes.distillation.on_policy.train import Config, main
from tests import extras

pytestmark = [pytest.mark.e2e, pytest.mark.slow, extras.requires("opd")]

CONFIGS = "recipes/distillation/on_policy/configs"


def test_opd_two_steps_score_every_sampled_token_and_keep_the_teacher_frozen(tmp_path):
    summary = main(
        Config(profile=f"{CONFIGS}/local-cpu-smollm2-teacher.json", steps=2, log_path=str(tmp_path))
    )
    metrics = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2]
    for m in metrics:
        assert m["teacher_term_token_count"] == m["sampled_tokens"] > 0
        assert m["teacher_reverse_kl"] == m["teacher_reverse_kl"]  # finite, not NaN
    # main() compares the teacher's fingerprint at the start, at the eval (step 2) and at the
    # end, and raises if it moved.
    assert len(summary["teacher_fingerprints"]) == 3 and summary["teacher_frozen"] is True
    assert summary["checkpoint_id"].startswith("cp_")
    probe = summary["alignment"]  # the start-up probe: sampler logprobs back from the trainer
    assert probe["positions"] > 0 and probe["mean_abs_diff"] < 1e-3
    written = [json.loads(x) for x in (tmp_path / "rollouts.jsonl").read_text().splitlines()]
    assert [r["step"] for r in written if r["group"] == 0] == [1, 2]
    assert all(r["reward"] is None and "teacher_reverse_kl" in r for r in written)


def test_a_teacher_taught_by_the_sft_journey_scores_groups_with_a_task_reward(tmp_path):
    """The task path on tiny models: the SFT journey's smoke run becomes the teacher (merged
    export), each prompt is sampled twice, rewards and the teacher term both train."""
    profile = f"{CONFIGS}/local-cpu-tiny-qwen3-task-smoke.json"
    teacher_run = tmp_path / "teacher"
    summary = main(
        Config(
            profile=profile,
            log_path=str(tmp_path / "opd"),
            teacher_run=str(teacher_run),
            rollouts_rate=1.0,
        )
    )
    teacher = summary["teacher"]
    assert teacher["sft_profile"] == "local-cpu-tiny-qwen3"
    exported = json.loads(
        (teacher_run / f"teacher-{teacher['checkpoint_id']}" / "export.json").read_text()
    )
    assert exported["kind"] == "hf-model" and teacher["model"].endswith(teacher["checkpoint_id"])
    assert (teacher_run / "summary.json").is_file()  # the SFT journey's own finished run
    metrics = [json.loads(x) for x in (tmp_path / "opd" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2]
    assert all(
        0.0 <= m["reward/mean"] <= 1.0 and m["teacher_term_token_count"] > 0 for m in metrics
    )
    assert "eval/accuracy" in metrics[-1]
    assert summary["eval_prompts"] == 128 and len(summary["eval_items"]["last"]["correct"]) == 128
    assert len(summary["eval_items"]["first"]["teacher_reverse_kl"]) == 128
    written = [
        json.loads(x) for x in (tmp_path / "opd" / "rollouts.jsonl").read_text().splitlines()
    ]
    step1 = [r for r in written if r["step"] == 1]
    assert sorted({(r["group"], r["sample"]) for r in step1}) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert all(r["reward"] in (0.0, 1.0) for r in written)
    assert (
        len({tuple(r["prompt_ids"]) for r in step1 if r["group"] == 0}) == 1
    )  # one prompt a group
    # a second run with the same teacher folder reuses the finished SFT run and its export
    again = main(
        Config(profile=profile, log_path=str(tmp_path / "again"), teacher_run=str(teacher_run))
    )
    assert (
        again["teacher"] == teacher
        and again["teacher_fingerprint"] == summary["teacher_fingerprint"]
    )
