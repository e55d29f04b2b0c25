"""What an OPD qualification checks and measures, from the runs' summaries.

Two shapes of qualification:

- **with a task reward** (the profile sets ``reward``): the distillation run and its
  ``teacher_tau=0`` comparison (the same loop, the same seeds, the reward alone). The teacher
  run must beat the comparison on the held-out eval, per prompt and paired: lower teacher
  reverse KL and higher task accuracy, each a paired bootstrap interval over the eval prompts
  (:mod:`cortex_recipes.intervals`) whose near end clears the bar in ``recipe.yaml``;
- **pure distillation** (no reward): one run whose held-out teacher KL falls from the first
  eval to the last, as a paired interval over the eval prompts.

Both need the training-batch teacher KL to fall too (the mean of the last three steps below
that of the first three), the teacher fingerprint compared during and after the run and
unchanged, the start-up alignment probe within its tolerance, and the teacher term present on
every step of a teacher run (absent from every step of a ``teacher_tau=0`` run).
"""

from __future__ import annotations

from typing import Any

from cortex_recipes import intervals

WINDOW = 3  # training steps averaged at each end of the batch-KL curve


def batch_kl_drop(summary: dict[str, Any]) -> float:
    """Mean training-batch teacher KL of the first ``WINDOW`` steps minus the last ``WINDOW``."""
    kls = summary["teacher_reverse_kl"]
    n = min(WINDOW, len(kls) // 2) or 1
    return sum(kls[:n]) / n - sum(kls[-n:]) / n


def _items(summary: dict[str, Any], which: str, key: str) -> list[float]:
    return summary["eval_items"][which][key]


def metrics(distill: dict[str, Any], comparison: dict[str, Any] | None = None) -> dict[str, Any]:
    """The OPD metrics ``recipe.yaml`` states ranges for (intervals where per-item values exist)."""
    out: dict[str, Any] = {
        # first minus last held-out KL of the distillation run, paired over the eval prompts
        "eval_teacher_reverse_kl_drop": intervals.paired_difference(
            "eval_teacher_reverse_kl_drop",
            _items(distill, "last", "teacher_reverse_kl"),
            _items(distill, "first", "teacher_reverse_kl"),
        ),
        "train_teacher_reverse_kl_drop": batch_kl_drop(distill),
    }
    if comparison is None:
        return out
    out["heldout_teacher_kl_advantage"] = intervals.paired_difference(
        "heldout_teacher_kl_advantage",  # the comparison's KL minus the teacher run's
        _items(distill, "last", "teacher_reverse_kl"),
        _items(comparison, "last", "teacher_reverse_kl"),
    )
    out["heldout_accuracy_advantage"] = intervals.paired_difference(
        "heldout_accuracy_advantage",  # the teacher run's accuracy minus the comparison's
        _items(comparison, "last", "correct"),
        _items(distill, "last", "correct"),
    )
    out["heldout_accuracy_gain"] = intervals.paired_difference(
        "heldout_accuracy_gain",
        _items(distill, "first", "correct"),
        _items(distill, "last", "correct"),
    )
    out["tau0_heldout_accuracy_gain"] = intervals.paired_difference(
        "tau0_heldout_accuracy_gain",
        _items(comparison, "first", "correct"),
        _items(comparison, "last", "correct"),
    )
    return out


def checks(distill: dict[str, Any], comparison: dict[str, Any] | None = None) -> dict[str, bool]:
    """The pass/fail checks of an OPD qualification (metric bars are in :func:`metrics`)."""
    out = {
        "teacher_contributed_every_step": all(t > 0 for t in distill["teacher_tokens"]),
        "train_teacher_kl_fell": batch_kl_drop(distill) > 0,
        # compared at the start, every eval and the end (the run also stops on a change)
        "teacher_frozen": _frozen(distill),
        "teacher_scores_aligned": _aligned(distill),
    }
    if comparison is None:
        return out
    return {
        **out,
        "tau0_no_teacher_contribution": all(t == 0 for t in comparison["teacher_tokens"]),
        "tau0_teacher_frozen": _frozen(comparison),
        "tau0_teacher_scores_aligned": _aligned(comparison),
        # the comparison is the same task against the same teacher: equal eval sets, and the
        # same teacher scores on the fingerprint probe
        "same_eval_prompts": distill["eval_prompts"] == comparison["eval_prompts"]
        and len(_items(distill, "last", "correct")) == len(_items(comparison, "last", "correct")),
        "same_teacher": distill["teacher_fingerprint"] == comparison["teacher_fingerprint"],
    }


def _frozen(summary: dict[str, Any]) -> bool:
    prints = summary.get("teacher_fingerprints") or []
    return bool(summary.get("teacher_frozen")) and len(prints) >= 3 and len(set(prints)) == 1


def _aligned(summary: dict[str, Any]) -> bool:
    """The run's start-up alignment probe ran and its mean |forward - sampler| was in bounds."""
    probe = summary.get("alignment") or {}
    return bool(probe.get("positions")) and probe["mean_abs_diff"] <= probe["tolerance"]
