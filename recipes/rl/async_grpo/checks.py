"""What a passing async GRPO qualification must show (prime-rl's orchestrator)."""

from __future__ import annotations

from typing import Any

from cortex_recipes.rl.checks import learning_checks


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
