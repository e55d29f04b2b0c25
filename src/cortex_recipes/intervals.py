"""95% intervals for qualification metrics: a bootstrap over eval items, or over seeds.

Qualification compares a measured quantity with a bar in ``recipe.yaml``. On a few dozen eval
items a point value moves by about the bar's own margin between seeds, so a record holds an
interval and the bar applies to its near end: ``min`` to the lower end, ``max`` to the upper
end (:func:`cortex_recipes.qualify.compare_metrics`).

The bootstrap resamples eval items with replacement from a seeded generator, so the same
per-item results always give the same interval. :func:`paired_difference` resamples the items
once for both sides of a before/after comparison: the difference's interval is then about the
change, not about which items happened to be hard.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from typing import Any

LEVEL = 0.95
RESAMPLES = 2000
SEED = 0


class IntervalError(ValueError):
    """Per-item results that cannot give an interval (empty, unequal lengths, not finite)."""


def _checked(name: str, values: Sequence[float]) -> list[float]:
    out = [float(v) for v in values]
    if not out:
        raise IntervalError(f"{name}: no items; an interval needs at least one per-item value")
    bad = [v for v in out if not math.isfinite(v)]
    if bad:
        raise IntervalError(f"{name}: per-item values must be finite numbers, got {bad[0]!r}")
    return out


def _percentiles(samples: list[float], level: float) -> tuple[float, float]:
    samples = sorted(samples)
    tail = (1.0 - level) / 2.0
    low = samples[int(math.floor(tail * (len(samples) - 1)))]
    high = samples[int(math.ceil((1.0 - tail) * (len(samples) - 1)))]
    return low, high


def interval(
    name: str,
    point: float,
    low: float,
    high: float,
    *,
    n: int,
    method: str,
    level: float = LEVEL,
) -> dict[str, Any]:
    """The record form of an interval: what ``compare_metrics`` reads."""
    return {
        "value": point,
        "low": low,
        "high": high,
        "level": level,
        "n": n,
        "method": method,
        "name": name,
    }


def bootstrap_mean(
    name: str,
    values: Sequence[float],
    *,
    level: float = LEVEL,
    resamples: int = RESAMPLES,
    seed: int = SEED,
) -> dict[str, Any]:
    """The mean of per-item ``values`` with a percentile-bootstrap interval over the items."""
    items = _checked(name, values)
    rng = random.Random(seed)
    size = len(items)
    means = [sum(rng.choices(items, k=size)) / size for _ in range(resamples)]
    low, high = _percentiles(means, level)
    return interval(
        name, sum(items) / size, low, high, n=size, method="bootstrap over items", level=level
    )


def paired_difference(
    name: str,
    before: Sequence[float],
    after: Sequence[float],
    *,
    level: float = LEVEL,
    resamples: int = RESAMPLES,
    seed: int = SEED,
) -> dict[str, Any]:
    """``mean(after) - mean(before)`` on the same items, with a paired bootstrap interval."""
    first, second = _checked(f"{name} (before)", before), _checked(f"{name} (after)", after)
    if len(first) != len(second):
        raise IntervalError(
            f"{name}: before has {len(first)} items and after has {len(second)}; a paired "
            "difference needs the same eval items on both sides"
        )
    deltas = [b - a for a, b in zip(first, second, strict=True)]
    rng = random.Random(seed)
    size = len(deltas)
    means = [sum(rng.choices(deltas, k=size)) / size for _ in range(resamples)]
    low, high = _percentiles(means, level)
    return interval(
        name,
        sum(deltas) / size,
        low,
        high,
        n=size,
        method="paired bootstrap over items",
        level=level,
    )


def across_seeds(name: str, values: Sequence[float], *, level: float = LEVEL) -> dict[str, Any]:
    """The mean over independent seeds with a Student-t interval (two or more seeds)."""
    items = _checked(name, values)
    if len(items) < 2:
        raise IntervalError(f"{name}: an interval over seeds needs two or more, got {len(items)}")
    size = len(items)
    mean = sum(items) / size
    var = sum((v - mean) ** 2 for v in items) / (size - 1)
    half = _t_quantile(size - 1, level) * math.sqrt(var / size)
    return interval(
        name, mean, mean - half, mean + half, n=size, method="t over seeds", level=level
    )


# Two-sided 95% Student-t quantiles by degrees of freedom; above 8 the dof-9 value is used,
# which is conservative (wider) up to 30 seeds, and 1.96 beyond.
_T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306}


def _t_quantile(dof: int, level: float) -> float:
    if level != LEVEL:
        raise IntervalError(f"level: only {LEVEL} is tabulated for seed intervals, got {level}")
    return _T95.get(dof, 1.96 if dof > 30 else 2.262)
