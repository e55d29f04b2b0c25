"""OPD with a task reward: the identity prompts, the profile rules, the advantages, the
teacher taught by the SFT journey (its checks, offline), and the qualification's checks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from cortex_recipes import frames
from cortex_recipes.distill.opd_profile import load_opd_profile
from cortex_recipes.profiles import ProfileError
from recipes.distillation.on_policy import checks
from recipes.distillation.on_policy.data import identity_prompts
from recipes.distillation.on_policy.teacher_sft import TeacherSFTError, check, sft_profile_path
from recipes.distillation.on_policy.train import step_advantages

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "recipes" / "distillation" / "on_policy" / "configs"
TASK = CONFIGS / "local-cpu-smollm2-snowflake.json"


def test_the_committed_identity_prompts_are_the_generators_and_disjoint():
    train, held_out = identity_prompts.split()
    assert identity_prompts.TRAIN.read_text() == identity_prompts.lines(train)
    assert identity_prompts.HELD_OUT.read_text() == identity_prompts.lines(held_out)
    assert len(train) == 64 and len(held_out) == 128 and not set(train) & set(held_out)
    assert all(p.count("Snowflake") == 1 for p in train + held_out)  # one option of four
    firsts = {p.split("(")[-1].split("Was it ")[-1].split(",")[0] for p in held_out}
    assert firsts == set(identity_prompts.ORGANISATIONS)  # Snowflake is not always first
    profile = load_opd_profile(TASK)
    assert profile.prompt_texts() == train and profile.eval_prompt_texts() == held_out


def test_the_reward_is_case_insensitive_containment():
    reward = load_opd_profile(TASK).reward
    assert reward.score("I was trained by SNOWFLAKE AI Research.") == 1.0
    assert reward.score("I was trained by Hugging Face.") == 0.0
    assert reward.score("Snowflake, OpenAI, Google or Meta") == 0.0  # echoing the options
    assert reward.score("I was trained by Snowflake, not OpenAI.") == 0.0  # another option named
    assert reward.score("Snowflake Snowflake Snowflake") == 0.0  # the name alone, repeated


def write(tmp_path: Path, **changes) -> Path:
    raw = {**json.loads(TASK.read_text()), **changes}
    (tmp_path / "configs").mkdir(exist_ok=True)
    path = tmp_path / "configs" / "p.json"
    path.write_text(json.dumps(raw))
    return path


@pytest.mark.parametrize(
    ("changes", "says"),
    [
        ({"group_size": 3}, r"rollouts_per_step=16 is not a multiple of group_size=3"),
        ({"group_size": 1}, r"needs group_size >= 2 .* got group_size=1"),
        ({"reward": {"contains": " "}}, r"reward.contains='' matches every completion"),
        ({"reward": None, "teacher_tau": 0.0}, r"teacher_tau=0 with no reward trains on nothing"),
    ],
)
def test_profiles_that_cannot_train_meaningfully_are_refused(tmp_path, changes, says):
    with pytest.raises(ProfileError, match=says):
        load_opd_profile(write(tmp_path, **changes))


def scored_batch(student, teacher, mask):
    return frames.Batch(
        input_ids=torch.ones(len(mask), len(mask[0]), dtype=torch.long),
        loss_mask=torch.tensor(mask),
        old_log_probs_shifted=torch.tensor(student),
        teacher_log_probs_shifted=torch.tensor(teacher),
    )


def test_advantages_are_group_relative_rewards_on_sampled_tokens_plus_the_teacher_baseline():
    mask = [[0.0, 1.0, 1.0], [0.0, 1.0, 0.0], [0.0, 1.0, 1.0], [0.0, 1.0, 1.0]]
    zeros = [[0.0] * 3 for _ in mask]
    batch = scored_batch(zeros, zeros, mask)
    rewards = [1.0, 0.0, 0.0, 0.0]  # groups of two: (1, 0) and (0, 0)
    alone = step_advantages(batch, rewards, 2, {"teacher_tau": 0.0})
    assert alone.tolist() == [[0, 0.5, 0.5], [0, -0.5, 0], [0, 0, 0], [0, 0, 0]]
    assert step_advantages(batch, None, 2, {"teacher_tau": 0.0}).abs().sum() == 0
    teacher = [[0.0, -1.0, -1.0]] * 4  # the teacher term is -1 on every sampled token
    taught = step_advantages(
        scored_batch(zeros, teacher, mask), rewards, 2, {"teacher_tau": 1.0, "teacher_clip": 5.0}
    )
    assert taught.tolist() == [[0, 1.5, 1.5], [0, 0.5, 0], [0, 1, 1], [0, 1, 1]]


def test_a_teacher_sft_is_checked_before_anything_trains():
    assert sft_profile_path("local-cpu-smollm2-lora").is_file()
    with pytest.raises(TeacherSFTError, match=r"teacher_sft='nope' is not an SFT profile.*"
                       r"accepted: .*local-cpu-smollm2-lora"):  # fmt: skip
        sft_profile_path("nope")
    with pytest.raises(TeacherSFTError, match=r"trains model='smollm2-135m-instruct', but "
                       r"teacher_model='tiny-qwen3'"):  # fmt: skip
        check("local-cpu-smollm2-lora", "tiny-qwen3", "local")
    with pytest.raises(TeacherSFTError, match=r"needs connection='local'"):
        check("local-cpu-smollm2-lora", "smollm2-135m-instruct", "/path/to/connection.json")


def summary(**over):
    base = {
        "teacher_reverse_kl": [2.0, 1.9, 1.8, 1.2, 1.0, 0.9],
        "teacher_tokens": [10, 12, 9, 11, 10, 10],
        "teacher_fingerprint": "ab",
        "teacher_fingerprints": ["ab", "ab", "ab"],
        "teacher_frozen": True,
        "alignment": {"positions": 9, "mean_abs_diff": 1e-6, "tolerance": 0.05},
        "eval_prompts": 8,
        "eval_items": {
            "first": {"teacher_reverse_kl": [3.0] * 8, "correct": [0.0] * 8},
            "last": {"teacher_reverse_kl": [1.0] * 6 + [1.2, 0.8], "correct": [1.0] * 7 + [0.0]},
        },
    }
    return {**base, **over}


def tau0(**over):
    flat = {"teacher_reverse_kl": [3.0] * 8, "correct": [0.0] * 8}
    return summary(
        **{"teacher_tokens": [0] * 6, "eval_items": {"first": flat, "last": flat}, **over}
    )


def test_the_task_comparison_passes_only_when_the_teacher_run_beats_the_reward_only_run():
    measured = checks.metrics(summary(), tau0())
    assert measured["heldout_teacher_kl_advantage"]["low"] == pytest.approx(2.0, abs=0.1)
    assert measured["heldout_accuracy_advantage"]["low"] > 0.5
    assert measured["tau0_heldout_accuracy_gain"]["value"] == 0.0
    assert all(checks.checks(summary(), tau0()).values())
    same = summary(eval_items=tau0()["eval_items"])  # the teacher run learned nothing more
    assert checks.metrics(same, tau0())["heldout_accuracy_advantage"]["high"] == 0.0
    assert not checks.checks(summary(teacher_reverse_kl=[1.0, 1.0, 1.0, 1.2, 1.3, 1.4]), tau0())[
        "train_teacher_kl_fell"
    ]
    assert not checks.checks(summary(), tau0(teacher_tokens=[0, 3]))["tau0_no_teacher_contribution"]
    assert not checks.checks(summary(), tau0(teacher_fingerprint="cd"))["same_teacher"]
    assert not checks.checks(summary(), tau0(eval_prompts=7))["same_eval_prompts"]


def test_frozen_and_aligned_read_the_fingerprints_and_the_probe():
    assert all(checks.checks(summary()).values())
    moved = summary(teacher_fingerprints=["ab", "cd", "ab"], teacher_frozen=False)
    assert not checks.checks(moved)["teacher_frozen"]
    assert not checks.checks(summary(teacher_fingerprints=["ab"]))["teacher_frozen"]  # unchecked
    off = summary(alignment={"positions": 9, "mean_abs_diff": 2.3, "tolerance": 0.05})
    assert not checks.checks(off)["teacher_scores_aligned"]
    assert not checks.checks(summary(alignment=None))["teacher_scores_aligned"]
    drop = checks.metrics(summary())["eval_teacher_reverse_kl_drop"]
    assert drop["value"] == pytest.approx(2.0) and 1.8 < drop["low"] < 2.0 < drop["high"] <= 2.2


def test_the_qualification_refuses_a_comparison_that_differs_in_more_than_teacher_tau(tmp_path):
    from recipes.distillation.on_policy.qualify import QualifyConfig, comparison_path

    default = QualifyConfig()
    assert comparison_path(default).name == "local-cpu-smollm2-snowflake-tau0.json"
    raw = json.loads((CONFIGS / "local-cpu-smollm2-snowflake-tau0.json").read_text())
    other = tmp_path / "other.json"
    other.write_text(json.dumps({**raw, "learning_rate": 0.01}))
    with pytest.raises(SystemExit, match=r"with teacher_tau=0; .* differs in \['learning_rate'\]"):
        comparison_path(QualifyConfig(comparison=str(other)))
    other.write_text(json.dumps({**raw, "teacher_tau": 0.5}))
    with pytest.raises(SystemExit, match=r"it has teacher_tau=0.5"):
        comparison_path(QualifyConfig(comparison=str(other)))
