"""Qualification intervals: bootstrap over eval items, paired differences, bars on the near end."""

import pytest

from cortex_recipes import intervals, qualify

pytestmark = pytest.mark.unit


def test_bootstrap_mean_brackets_the_mean_and_is_deterministic():
    values = [1.0] * 40 + [0.0] * 88
    first = intervals.bootstrap_mean("acc", values)
    again = intervals.bootstrap_mean("acc", values)
    assert first == again
    assert first["value"] == pytest.approx(40 / 128)
    assert first["low"] < first["value"] < first["high"]
    # About 1.96 * sqrt(p(1-p)/n) ~ 0.08 on each side for p ~ 0.31, n = 128.
    assert 0.05 < first["value"] - first["low"] < 0.12
    assert first["n"] == 128 and first["level"] == 0.95


def test_constant_items_give_a_point_interval():
    result = intervals.bootstrap_mean("acc", [1.0] * 10)
    assert result["low"] == result["high"] == result["value"] == 1.0


def test_paired_difference_is_narrower_than_the_unpaired_spread():
    # The same 100 items: 30 easy ones right on both sides, 30 more learned after training.
    before = [1.0] * 30 + [0.0] * 70
    after = [1.0] * 60 + [0.0] * 40
    diff = intervals.paired_difference("gain", before, after)
    assert diff["value"] == pytest.approx(0.30)
    assert 0.20 < diff["low"] < 0.30 < diff["high"] < 0.40
    assert diff["method"] == "paired bootstrap over items"


def test_paired_difference_needs_the_same_items():
    with pytest.raises(intervals.IntervalError, match="before has 3 items and after has 2"):
        intervals.paired_difference("gain", [0, 1, 0], [1, 1])


def test_empty_or_non_finite_items_fail_closed():
    with pytest.raises(intervals.IntervalError, match="acc: no items"):
        intervals.bootstrap_mean("acc", [])
    with pytest.raises(intervals.IntervalError, match="must be finite"):
        intervals.bootstrap_mean("acc", [0.5, float("nan")])


def test_across_seeds_uses_student_t():
    result = intervals.across_seeds("kl", [0.10, 0.14])
    # mean 0.12, s = 0.0283, t(1) = 12.706: half width 0.254.
    assert result["value"] == pytest.approx(0.12)
    assert result["high"] - result["value"] == pytest.approx(12.706 * 0.02, rel=1e-3)
    with pytest.raises(intervals.IntervalError, match="two or more"):
        intervals.across_seeds("kl", [0.1])


def test_a_min_bar_applies_to_the_lower_end_and_a_max_bar_to_the_upper_end():
    expected = {
        "gain": {"description": "rises", "min": 0.1},
        "before": {"description": "low at start", "max": 0.4},
    }
    clear = {"value": 0.3, "low": 0.15, "high": 0.45}
    straddles = {"value": 0.3, "low": 0.05, "high": 0.45}
    assert qualify.compare_metrics({"gain": clear}, expected)["gain"]["within"] is True
    # The point value clears the bar, but the interval does not: the bar is not met.
    assert qualify.compare_metrics({"gain": straddles}, expected)["gain"]["within"] is False
    high = {"value": 0.3, "low": 0.2, "high": 0.41}
    compared = qualify.compare_metrics({"before": high}, expected)["before"]
    assert compared["within"] is False
    assert compared["value"] == 0.3 and compared["low"] == 0.2 and compared["max"] == 0.4


def test_an_interval_without_its_ends_is_rejected():
    with pytest.raises(ValueError, match="missing \\['low'\\]"):
        qualify.compare_metrics({"gain": {"value": 0.3, "high": 0.4}}, {})


def test_grpo_learning_checks_use_the_paired_interval_over_eval_items():
    from cortex_recipes.rl.checks import eval_gain, learning_checks

    before = [1] * 24 + [0] * 104
    learned = [1] * 64 + [0] * 64
    noise = [0] * 8 + [1] * 24 + [0] * 96  # the same count, other items: no gain at all
    summary = {
        "rewards": [0.1, 0.2, 0.4, 0.5],
        "eval_accuracy": [
            {"step": 0, "accuracy": 24 / 128, "correct": before},
            {"step": 10, "accuracy": 0.5, "correct": learned},
        ],
    }
    assert eval_gain(summary)["low"] > 0.2
    assert learning_checks(summary) == {
        "reward_rose": True,
        "eval_accuracy_rose_beyond_interval": True,
    }
    summary["eval_accuracy"][1] = {"step": 10, "accuracy": 24 / 128, "correct": noise}
    assert learning_checks(summary)["eval_accuracy_rose_beyond_interval"] is False


def test_grpo_eval_gain_needs_per_item_results():
    from cortex_recipes.rl.checks import eval_gain

    summary = {"eval_accuracy": [{"step": 0, "accuracy": 0.2}, {"step": 5, "accuracy": 0.5}]}
    with pytest.raises(ValueError, match="step 0: no per-item 'correct' list"):
        eval_gain(summary)


def test_prime_rl_checks_pin_lag_sync_overlap_and_the_resume():
    from recipes.rl.async_grpo.checks import primerl_checks

    summary = {
        "rewards": [0.1, 0.2, 0.4, 0.5],
        "eval_accuracy": [
            {"step": 0, "accuracy": 24 / 128, "correct": [1] * 24 + [0] * 104},
            {"step": 4, "accuracy": 0.5, "correct": [1] * 64 + [0] * 64},
        ],
        "overlap_fraction": 0.4,
        "published_versions": [0, 1, 2, 3, 4],
        "applied_versions": [0, 1, 2],
        "resumed_from_step": 2,
    }
    run = {
        "summary": summary,
        "events": [{"event": "training killed", "after_step": 3}],
        "steps_logged": [1, 2, 3, 4],
        "off_policy_max_per_step": [0.0, 1.0, 2.0, 1.0],
    }
    lag = 2  # max_off_policy_steps
    assert all(primerl_checks(run, 4, lag).values()), primerl_checks(run, 4, lag)
    for change, failed in [
        ({"off_policy_max_per_step": [0.0, 1.0, 3.0, 1.0]}, "lag_within_max_off_policy_steps"),
        ({"off_policy_max_per_step": [0.0, 1.0, None, 1.0]}, "lag_observed_every_step"),
        ({"off_policy_max_per_step": [0.0] * 4}, "sampling_ran_ahead"),
        ({"steps_logged": [1, 2, 2, 3, 4]}, "every_step_once_in_order"),
        ({"summary": {**summary, "applied_versions": [0, 2]}}, "weight_sync_every_step"),
        ({"summary": {**summary, "overlap_fraction": 0.0}}, "rollouts_overlapped_training"),
        ({"summary": {**summary, "resumed_from_step": None}}, "resumed_after_process_kill"),
    ]:
        checks = primerl_checks({**run, **change}, 4, lag)
        assert [k for k, ok in checks.items() if not ok] == [failed], change
    # a run with a backend kill must show the reconnect too
    killed = {**run, "events": [{"event": "backend killed", "after_step": 2}, *run["events"]]}
    assert primerl_checks({**killed, "reconnected_in_process": True}, 4, lag)[
        "reconnected_after_backend_kill"
    ]
    checks = primerl_checks({**killed, "reconnected_in_process": False}, 4, lag)
    assert [k for k, ok in checks.items() if not ok] == ["reconnected_after_backend_kill"]
