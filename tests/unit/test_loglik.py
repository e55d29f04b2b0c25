"""Held-out answer log-likelihood, the weight comparison, and its SFT checks and bar."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from cortex_recipes import loglik, qualify, sft
from cortex_recipes.profiles import ProfileError
from recipes.sft.conversational import checks as sft_checks

pytestmark = pytest.mark.unit

PROFILE = "recipes/sft/conversational/configs/local-cpu-smollm2-weighted-lora.json"


def test_mean_target_logprobs_averages_only_the_masked_columns():
    logprobs = torch.tensor([[-9.0, -1.0, -3.0, -9.0], [-9.0, -9.0, -2.0, -9.0]])
    mask = torch.tensor([[0.0, 1.0, 1.0, 0.0], [0.0, 0.0, 1.0, 0.0]])
    assert loglik.mean_target_logprobs(logprobs, mask) == [-2.0, -2.0]


@pytest.mark.parametrize(
    ("logprobs", "message"),
    [
        (torch.zeros(2, 3), r"shape \[2, 3\]; expected \[2, 4\]"),
        (None, "shape NoneType"),
        (torch.tensor([[0.0, float("nan"), 0.0, 0.0]] * 2), "row 0: mean log-probability nan"),
    ],
)
def test_bad_logprobs_are_refused_with_the_reason(logprobs, message):
    mask = torch.tensor([[0.0, 1.0, 0.0, 0.0], [0.0, 1.0, 0.0, 0.0]])
    with pytest.raises(loglik.LoglikError, match=message):
        loglik.mean_target_logprobs(logprobs, mask)


def test_a_row_without_a_scored_position_is_refused():
    with pytest.raises(loglik.LoglikError, match="row 1: no scored position"):
        loglik.mean_target_logprobs(torch.zeros(2, 2), torch.tensor([[1.0, 0.0], [0.0, 0.0]]))


def test_compare_weights_gives_per_item_gains_and_the_paired_difference():
    before = {"full": [-3.0, -4.0, -5.0], "down": [-3.0, -4.0, -6.0]}
    after = {"full": [-0.5, -1.0, -1.5], "down": [-2.5, -3.0, -5.0]}
    result = loglik.compare_weights(before, after, full_weight=1.0, down_weight=0.2)
    assert result["gains"] == {"full": [2.5, 3.0, 3.5], "down": [0.5, 1.0, 1.0]}
    diff = result["gain_difference"]
    assert diff["value"] == pytest.approx((2.0 + 2.0 + 2.5) / 3)
    assert 2.0 <= diff["low"] <= diff["value"] <= diff["high"] <= 2.5
    assert result["full_gain"]["value"] == pytest.approx(3.0)
    assert result["down_gain"]["low"] > 0


def test_equal_gains_give_a_difference_interval_that_reaches_zero():
    before = {"full": [-3.0, -4.0, -5.0, -2.0], "down": [-3.0, -4.0, -5.0, -2.0]}
    after = {"full": [-1.0, -4.0, -3.0, -2.0], "down": [-3.0, -2.0, -3.0, -2.0]}
    diff = loglik.compare_weights(before, after, full_weight=1.0, down_weight=0.2)[
        "gain_difference"
    ]
    assert diff["value"] == 0.0 and diff["low"] < 0 < diff["high"]


def test_compare_weights_refuses_unequal_item_counts():
    with pytest.raises(loglik.LoglikError, match="down: 2 scores before training and 1 after"):
        loglik.compare_weights(
            {"full": [0.0], "down": [0.0, 0.0]},
            {"full": [0.0], "down": [0.0]},
            full_weight=1.0,
            down_weight=0.5,
        )


def _summary(comparison) -> dict:
    evaluation = {"held_out_hits": 0, "held_out_total": 3, "controls": []}
    return {
        "eval_before": evaluation,
        "eval_after": {**evaluation, "held_out_hits": 3},
        "losses": [2.0, 0.1],
        **({"weight_comparison": comparison} if comparison else {}),
    }


def _comparison(full_after, down_after):
    before = {"full": [-4.0, -4.0, -4.0], "down": [-4.0, -4.0, -4.0]}
    return loglik.compare_weights(
        before, {"full": full_after, "down": down_after}, full_weight=1.0, down_weight=0.2
    )


def test_sft_checks_pass_when_the_full_weight_answer_is_learned_more():
    runs = [_summary(_comparison([-1.0, -1.2, -0.8], [-3.0, -3.5, -3.2]))] * 2
    checks = sft_checks.sft_checks(runs, weight_comparison=True)
    assert checks["full_weight_learned_more_than_down_weighted"]
    assert checks["down_weighted_still_learned"]
    assert all(checks.values())


def test_sft_checks_fail_when_the_weights_made_no_difference_or_nothing_was_measured():
    same = _summary(_comparison([-1.0, -3.0, -2.0], [-3.0, -1.0, -2.0]))
    checks = sft_checks.sft_checks([same, same], weight_comparison=True)
    assert not checks["full_weight_learned_more_than_down_weighted"]
    unmeasured = sft_checks.sft_checks([_summary(None)] * 2, weight_comparison=True)
    assert not unmeasured["full_weight_learned_more_than_down_weighted"]
    assert not unmeasured["down_weighted_still_learned"]


def test_sft_checks_without_a_declared_comparison_are_the_chat_template_checks():
    checks = sft_checks.sft_checks([_summary(None)] * 2)
    assert set(checks) == {
        "taught_behaviour_absent_before",
        "taught_behaviour_present_after",
        "controls_kept_after",
        "loss_fell",
        "deterministic_across_runs",
    }


def test_runs_whose_comparisons_differ_are_not_deterministic():
    a = _summary(_comparison([-1.0, -1.2, -0.8], [-3.0, -3.5, -3.2]))
    b = _summary(_comparison([-1.0, -1.2, -0.9], [-3.0, -3.5, -3.2]))
    assert not sft_checks.sft_checks([a, b], weight_comparison=True)["deterministic_across_runs"]


def test_the_gain_difference_bar_applies_to_the_interval_lower_end_of_its_profiles_only():
    metrics = sft_checks.sft_metrics(
        [_summary(_comparison([-1.0, -1.5, -0.2], [-3.0, -3.5, -2.5]))]
    )
    diff = metrics["held_out_loglik_gain_difference"]
    expected = {
        "held_out_loglik_gain_difference": {
            "description": "d",
            "min": diff["low"] + 1e-6,  # the point value clears it, the lower end does not
            "profiles": ["weighted"],
        }
    }
    assert diff["value"] > expected["held_out_loglik_gain_difference"]["min"]
    compared = qualify.compare_metrics(metrics, expected, profile="weighted")
    assert compared["held_out_loglik_gain_difference"]["within"] is False
    other = qualify.compare_metrics({"final_loss": 0.1}, expected, profile="identity")
    assert "held_out_loglik_gain_difference" not in other  # not this profile's bar
    unscoped = {"held_out_loglik_gain_difference": {"description": "d", "min": 0.1}}
    missing = qualify.compare_metrics({"final_loss": 0.1}, unscoped, profile="identity")
    assert missing["held_out_loglik_gain_difference"]["within"] is False


def test_the_weighted_profile_declares_a_comparison_its_data_agrees_with():
    profile = sft.load_profile(PROFILE)
    spec = profile.eval.weight_comparison
    assert profile.renderer == "default"
    assert spec.down.weight < spec.full.weight == 1.0
    assert len(spec.full.prompts) == len(spec.down.prompts) >= 8
    conversations = sft.load_conversations(profile.dataset_path)
    spec.check_data(conversations)
    trained = {m["content"] for c in conversations for m in c if m["role"] == "user"}
    assert not trained & set(spec.full.prompts + spec.down.prompts)  # held out
    counts = {
        answer: sum(m.get("content") == answer for c in conversations for m in c)
        for answer in (spec.full.answer, spec.down.answer)
    }
    assert counts[spec.full.answer] == counts[spec.down.answer] > 0  # balanced


def test_data_whose_weight_disagrees_with_the_declared_one_is_refused():
    spec = sft.load_profile(PROFILE).eval.weight_comparison
    conversation = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": spec.down.answer, "weight": 1.0},
    ]
    with pytest.raises(ProfileError, match=r"messages\[1\].weight=1.0 but .* declares 0.2"):
        spec.check_data([conversation])
    with pytest.raises(ProfileError, match="appear in no assistant message"):
        spec.check_data([[{"role": "user", "content": "q"}]])


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"down": {"weight": 1.0}}, r"down.weight=1.0 must be below full.weight=1.0"),
        ({"down": {"prompts": ["only one"]}}, "the items are paired"),
        ({"full": {"weight": 0}}, r"full.weight=0.0 must be > 0"),
    ],
)
def test_a_bad_weight_comparison_is_named(tmp_path, change, message):
    raw = json.loads(Path(PROFILE).read_text())
    for side, fields in change.items():
        raw["eval"]["weight_comparison"][side].update(fields)
    path = tmp_path / "configs" / "p.json"
    path.parent.mkdir()
    path.write_text(json.dumps({**raw, "name": "p"}))
    with pytest.raises(ProfileError, match=message):
        sft.load_profile(path)
