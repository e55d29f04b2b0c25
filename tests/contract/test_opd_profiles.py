"""OPD profiles build the three sub-jobs and the grpo teacher block the journey relies on."""

import json
from pathlib import Path

import pytest

from cortex_recipes.distill.opd_profile import load_opd_profile
from cortex_recipes.distill.teacher import teacher_baseline
from cortex_recipes.profiles import ProfileError

pytestmark = pytest.mark.contract

CONFIGS = sorted(
    Path(__file__).resolve().parents[2].glob("recipes/distillation/on_policy/configs/*.json")
)


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_profile_builds_student_trainer_student_sampler_and_teacher(path):
    profile = load_opd_profile(path)
    assert (profile.recipe_dir / profile.prompts).is_file()
    jobs = profile.sub_jobs()
    for job in jobs:
        job.validate()
    assert [j.job_type.value for j in jobs] == ["training", "sampling", "log_probability"]
    assert jobs[0].model_name == jobs[1].model_name == profile.model
    assert jobs[2].model_name == profile.teacher_model
    config = profile.loss_config()
    if profile.teacher_tau > 0:
        assert config["teacher_clip"] > 0 and config["teacher_tau"] == profile.teacher_tau
    else:
        assert config == {"eps_clip": config["eps_clip"], "teacher_tau": 0.0}


def test_teacher_tau_without_clip_is_rejected(tmp_path):
    raw = json.loads(CONFIGS[0].read_text())
    raw.update(teacher_tau=1.0, teacher_clip=None)
    (tmp_path / "configs").mkdir()
    path = tmp_path / "configs" / "p.json"
    path.write_text(json.dumps(raw))
    with pytest.raises(ProfileError, match="needs a positive teacher_clip"):
        load_opd_profile(path)


def test_baseline_centres_the_teacher_term_and_is_zero_without_a_teacher():
    import torch

    student = torch.zeros(1, 4)
    teacher = torch.tensor([[-1.0, -3.0, 0.0, 9.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0, 0.0]])
    config = {"teacher_tau": 1.0, "teacher_clip": 2.0}
    base = teacher_baseline(student, teacher, mask, config)
    # terms on scored tokens: -1, -2 (clipped); mean -1.5; base = +1.5 on scored tokens only.
    assert base.tolist() == [[1.5, 1.5, 0.0, 0.0]]
    assert teacher_baseline(student, teacher, mask, {"teacher_tau": 0.0}).abs().sum() == 0
