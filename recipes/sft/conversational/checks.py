"""What a passing SFT qualification must show, and the metrics recipe.yaml states ranges for."""

from __future__ import annotations

from typing import Any


def sft_checks(runs: list[dict[str, Any]], *, weight_comparison: bool = False) -> dict[str, bool]:
    """What a passing SFT qualification must show, from two runs of the same profile.

    A profile that declares ``eval.weight_comparison`` (``weight_comparison=True``) must also
    show its full-weight answer's held-out log-likelihood rising more than its down-weighted
    answer's, the whole 95% interval of the paired difference above zero, and the
    down-weighted answer still learned (its gain's interval above zero: the fractional weight
    was kept, not dropped to 0); its bar is ``held_out_loglik_gain_difference`` in
    recipe.yaml.
    """
    first = runs[0]
    before, after = first["eval_before"], first["eval_after"]
    checks = {
        "taught_behaviour_absent_before": before["held_out_hits"] == 0,
        "taught_behaviour_present_after": after["held_out_hits"] == after["held_out_total"],
        "controls_kept_after": all(c["ok"] for c in after["controls"]),
        "loss_fell": first["losses"][-1] < first["losses"][0],
        "deterministic_across_runs": all(
            r["losses"] == first["losses"]
            and r["eval_after"] == after
            and r.get("weight_comparison") == first.get("weight_comparison")
            for r in runs[1:]
        ),
    }
    if weight_comparison:
        compared = first.get("weight_comparison")
        checks["full_weight_learned_more_than_down_weighted"] = bool(
            compared and compared["gain_difference"]["low"] > 0
        )
        checks["down_weighted_still_learned"] = bool(compared and compared["down_gain"]["low"] > 0)
    return checks


def sft_metrics(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The SFT metrics recipe.yaml states ranges for, from the first run; a run with a weight
    comparison adds the held-out log-likelihood gains as intervals."""
    first = runs[0]
    metrics: dict[str, Any] = {
        "final_loss": first["losses"][-1],
        "held_out_identity_hits_before": first["eval_before"]["held_out_hits"],
        "held_out_identity_hits_after": first["eval_after"]["held_out_hits"],
    }
    compared = first.get("weight_comparison")
    if compared:
        metrics["held_out_loglik_gain_full"] = compared["full_gain"]
        metrics["held_out_loglik_gain_down"] = compared["down_gain"]
        metrics["held_out_loglik_gain_difference"] = compared["gain_difference"]
    return metrics
