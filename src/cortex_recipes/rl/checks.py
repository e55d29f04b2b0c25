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
