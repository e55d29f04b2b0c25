"""The idle clock of hosted-conformance mode (rule ``idle-timeout`` of
:mod:`cortex_recipes.local.hosted`): the create-job timeouts as hosted documents them, and the
test-only clock scale. The registry (:mod:`cortex_recipes.local.jobs`) ends an idle job; the HTTP
gate (:mod:`cortex_recipes.local.hosted_gate`) stamps a job's clock on each request below it."""

from __future__ import annotations

import os
from typing import Any

from cortex_recipes.local import hosted
from cortex_recipes.local.specs import abridge

# For tests only: how many times faster than the wall clock a hosted-mode job's idle time counts
# (a float > 0, default 1), read once by the server process. Hosted's shortest idle timeout is
# 300 s; a test sets e.g. 300 so that it passes in about a second.
IDLE_CLOCK_SCALE_ENV = "CORTEX_RECIPES_IDLE_CLOCK_SCALE"
# The hosted service's idle timeout when a job names none (the SDK's REST reference, create-job).
DEFAULT_IDLE_TIMEOUT_S = 1800
# The hosted ranges of the create-job timeouts, in seconds (idle also takes 0: never).
TIMEOUT_RANGE = (300, 604_800)
# How often the registry looks for idle jobs.
IDLE_CHECK_S = 0.2


def idle_clock_scale() -> float:
    """``$CORTEX_RECIPES_IDLE_CLOCK_SCALE`` (tests only): a float > 0, default 1."""
    raw = os.environ.get(IDLE_CLOCK_SCALE_ENV, "").strip()
    if not raw:
        return 1.0
    try:
        scale = float(raw)
    except ValueError:
        scale = 0.0
    if not scale > 0 or scale == float("inf"):
        raise ValueError(
            f"${IDLE_CLOCK_SCALE_ENV}={raw!r}; accepted: a finite number > 0 (tests only: how "
            "many times faster a hosted-mode job's idle time counts; default 1)"
        )
    return scale


def hosted_idle_timeout(body: dict[str, Any]) -> int:
    """Rule ``idle-timeout``: the create-job timeouts checked as hosted documents them; the idle
    timeout in seconds (0: never)."""
    low, high = TIMEOUT_RANGE
    for key, zero in (("idle_timeout_seconds", True), ("pending_timeout_seconds", False)):
        value = body.get(key)
        if value is None:
            continue
        if (
            isinstance(value, bool)
            or not isinstance(value, int)
            or not ((zero and value == 0) or low <= value <= high)
        ):
            raise hosted.refuse(
                "idle-timeout",
                f"{key}={abridge(value)}; accepted: "
                + ("0 (never idle-terminated) or " if zero else "")
                + f"an integer {low}..{high} (seconds)",
            )
    idle = body.get("idle_timeout_seconds")
    return DEFAULT_IDLE_TIMEOUT_S if idle is None else idle
