"""What a passing GRPO qualification must show (used by the journeys' qualify commands)."""

from __future__ import annotations

from typing import Any

from cortex_recipes.rl.policy_lag import LagConfig


def _window_means(values: list[float], parts: int = 2) -> list[float]:
    size = max(1, len(values) // parts)
    return [sum(values[i : i + size]) / len(values[i : i + size]) for i in (0, len(values) - size)]


def learning_checks(summary: dict[str, Any]) -> dict[str, bool]:
    early, late = _window_means(summary["rewards"])
    evals = summary["eval_accuracy"]
    return {
        "reward_rose": late > early,
        "eval_accuracy_rose": evals[-1]["accuracy"] >= evals[0]["accuracy"] + 0.3,
    }


def async_grpo_checks(run: dict[str, Any], max_steps: int, lag: LagConfig) -> dict[str, bool]:
    summary = run["summary"]
    kinds = [e["event"] for e in run["events"]]
    return {
        **learning_checks(summary),
        "lag_within_max_async_level": max(run["off_policy_max_per_step"]) <= lag.max_async_level,
        "lag_within_max_off_policy_steps": max(run["off_policy_max_per_step"])
        <= lag.max_off_policy_steps,
        "sampling_ran_ahead": max(run["off_policy_max_per_step"]) >= 1,
        "rollouts_overlapped_training": summary["overlap_fraction"] > 0.0,
        "every_step_once_in_order": run["steps_logged"] == list(range(1, max_steps + 1)),
        "reconnected_after_backend_kill": "backend killed" in kinds
        and run["reconnected_in_process"],
        "resumed_after_process_kill": "training killed" in kinds
        and summary["resumed_from_step"] is not None,
    }
