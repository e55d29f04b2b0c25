"""What a passing GRPO qualification must show (used by the journeys' qualify commands)."""

from __future__ import annotations

from typing import Any

from cortex_recipes.intervals import paired_difference


def _window_means(values: list[float], parts: int = 2) -> list[float]:
    size = max(1, len(values) // parts)
    return [sum(values[i : i + size]) / len(values[i : i + size]) for i in (0, len(values) - size)]


def eval_gain(summary: dict[str, Any]) -> dict[str, Any]:
    """First-to-last eval accuracy change with a paired bootstrap interval over the eval items."""
    evals = summary["eval_accuracy"]
    first, last = evals[0], evals[-1]
    for entry in (first, last):
        if not entry.get("correct"):
            raise ValueError(
                f"eval_accuracy at step {entry.get('step')}: no per-item 'correct' list; the "
                "interval needs which items were right (greedy_eval returns it)"
            )
    return paired_difference("eval_accuracy_gain", first["correct"], last["correct"])


def learning_checks(summary: dict[str, Any]) -> dict[str, bool]:
    """Reward rose within training, and eval accuracy rose beyond its 95% interval."""
    early, late = _window_means(summary["rewards"])
    return {
        "reward_rose": late > early,
        "eval_accuracy_rose_beyond_interval": eval_gain(summary)["low"] > 0.0,
    }


def primerl_checks(
    run: dict[str, Any], max_steps: int, max_off_policy_steps: int
) -> dict[str, bool]:
    """The async GRPO checks: prime-rl's orchestrator bounds the lag (``max_off_policy_steps``),
    so what is checked is what it observed per step, plus the adapters' weight sync, the
    reconnect after a backend kill (when the run had one) and the kill-and-resume."""
    summary = run["summary"]
    lags = run["off_policy_max_per_step"]
    kinds = [e["event"] for e in run["events"]]
    observed = [x for x in lags if x is not None]
    return {
        **learning_checks(summary),
        "lag_observed_every_step": len(observed) == len(lags) == max_steps,
        "lag_within_max_off_policy_steps": bool(observed) and max(observed) <= max_off_policy_steps,
        "sampling_ran_ahead": bool(observed) and max(observed) >= 1,
        "rollouts_overlapped_training": summary["overlap_fraction"] > 0.0,
        "every_step_once_in_order": run["steps_logged"] == list(range(1, max_steps + 1)),
        # Every version that was sampled from (all but the last two, which nothing samples
        # from once the last batch has shipped) was applied to a sampler.
        "weight_sync_every_step": summary["published_versions"] == list(range(max_steps + 1))
        and set(range(max(max_steps - 1, 0))) <= set(summary["applied_versions"]),
        **(
            {"reconnected_after_backend_kill": run["reconnected_in_process"]}
            if "backend killed" in kinds
            else {}
        ),
        "resumed_after_process_kill": "training killed" in kinds
        and summary["resumed_from_step"] is not None,
    }
