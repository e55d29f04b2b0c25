"""One home for the ``grpo`` config: the backend fills exactly these defaults, the journeys'
profiles default to them, and the teacher term's clip is read one way on both sides."""

from __future__ import annotations

import dataclasses

import pytest

from cortex_recipes import grpo_loss
from cortex_recipes.distill.opd_profile import OPDProfile
from cortex_recipes.local.errors import BackendError
from cortex_recipes.local.loss_schemas import parse_processing
from cortex_recipes.tito.tito_profile import RL

pytestmark = pytest.mark.unit


def test_the_backend_fills_a_bare_grpo_config_with_the_shared_defaults():
    processing = parse_processing({"loss_fn": "grpo"}, require_loss=True)
    assert processing.config == grpo_loss.DEFAULTS
    assert processing.config == dataclasses.asdict(grpo_loss.GRPOLoss())


def test_the_backend_accepts_every_shared_key_and_refuses_others_naming_them():
    config = {**grpo_loss.DEFAULTS, "eps_clip": 0.1, "teacher_tau": 0.5, "teacher_clip": 2.0}
    assert parse_processing({"loss_fn": "grpo", "config": config}, require_loss=True).config == (
        config
    )
    with pytest.raises(BackendError, match=r"unknown keys \['eps'\].*accepted: .*eps_clip"):
        parse_processing({"loss_fn": "grpo", "config": {"eps": 0.2}}, require_loss=True)


def test_journey_profiles_default_to_the_shared_clip():
    defaults = {f.name: f.default for f in dataclasses.fields(OPDProfile)}
    assert defaults["eps_clip"] == grpo_loss.DEFAULTS["eps_clip"]
    assert {f.name: f.default for f in dataclasses.fields(RL)}["eps_clip"] == (
        grpo_loss.DEFAULTS["eps_clip"]
    )


def test_frames_always_name_the_clip_and_aggregation():
    assert grpo_loss.with_defaults_named({}) == {"eps_clip": 0.2, "loss_agg_mode": "token-mean"}
    assert grpo_loss.with_defaults_named({"eps_clip": 0.3})["eps_clip"] == 0.3


def test_teacher_keys_are_sent_only_with_a_teacher():
    assert grpo_loss.teacher_config(0.0, 1.0, 2.0) == {"teacher_tau": 0.0}
    assert grpo_loss.teacher_config(0.5, 1.0, None) == {"teacher_tau": 0.5, "teacher_clip": 1.0}
    assert grpo_loss.teacher_config(0.5, 1.0, 2.0)["teacher_clip_negative"] == 2.0


def test_the_negative_teacher_clip_defaults_to_the_positive_one():
    assert grpo_loss.teacher_clip_bounds({"teacher_clip": 1.5}) == (1.5, 1.5)
    assert grpo_loss.teacher_clip_bounds({"teacher_clip": 1.5, "teacher_clip_negative": None}) == (
        1.5,
        1.5,
    )
    assert grpo_loss.teacher_clip_bounds({"teacher_clip": 1.5, "teacher_clip_negative": 3}) == (
        3.0,
        1.5,
    )
