"""Wall-clock ratio of asynchronous GRPO (prime-rl's orchestrator) to the synchronous example.

This runs the synchronous example (recipes/rl/math_grpo) and the asynchronous journey
(recipes/rl/async_grpo: prime-rl's orchestrator and env-server through this project's
adapters) from the same profile: same model, problems, seeds, batch and group sizes, and number
of steps. Each runs on its own fresh local backend. It prints the loop times and
``async / sync`` (below 1.0 means async is faster).

    CORTEX_RECIPES_PRIMERL_PYTHON=... python bench/async_vs_sync.py --steps 6

The synchronous loop time is its steps without backend start-up and the step-0 eval. The async
loop time is the sum of the trainer adapter's ``time/step`` (the wait for each batch included,
and so, in step 1, the wait for prime-rl's orchestrator and env-server to start; the evals are
not). ``ratio_steps_2_on`` compares steps 2..N of both, once both loops run. prime-rl's taskset has no simulated verifier
latency, so there is no latency sweep.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the recipes package

DEFAULT_PROFILE = "recipes/rl/async_grpo/configs/local-cpu-smollm2-lora.json"
ASYNC_KEYS = ("max_off_policy_steps", "max_inflight_groups")
CANCELLED = "primerl/train/agg/all/cancelled/mean"
DROPPED = "primerl/off_policy/dropped"


def sync_profile(async_profile: Path, out: Path) -> Path:
    raw = json.loads(async_profile.read_text())
    for key in ASYNC_KEYS:
        raw["orchestrator"].pop(key, None)
    raw.pop("ckpt", None)
    out.write_text(json.dumps(raw))
    return out


def summarise(work: Path, steps: int) -> dict:
    """The comparison from a finished work folder (both runs' summaries and metrics)."""
    from cortex_recipes.plots import read_metrics

    sync = json.loads((work / "sync" / "summary.json").read_text())
    overlapped = json.loads((work / "async" / "summary.json").read_text())
    records = read_metrics(work / "async")
    async_loop = round(sum(r["time/step"] for r in records), 3)
    sync_steps = [r["time/step"] for r in read_metrics(work / "sync")]
    async_steps = [r["time/step"] for r in records]
    # Step 1 of the async run also waits for prime-rl's processes to start (tens of seconds of
    # Python 3.12 imports), which the sync loop has no counterpart of: steps 2..N compare the
    # loops once both are running.
    steady_sync, steady_async = round(sum(sync_steps[1:]), 3), round(sum(async_steps[1:]), 3)
    return {
        "steps": steps,
        "sync_loop_s": sync["loop_time_s"],
        "async_loop_s": async_loop,
        "ratio_async_over_sync": round(async_loop / sync["loop_time_s"], 3),
        "sync_steps_2_on_s": steady_sync,
        "async_steps_2_on_s": steady_async,
        "ratio_steps_2_on": round(steady_async / steady_sync, 3) if steady_sync else None,
        "sync_step_s": sync_steps,
        "async_step_s": async_steps,
        "async_overlap_fraction": round(overlapped["overlap_fraction"], 3),
        "async_off_policy_max": max(overlapped["off_policy_max_per_step"]),
        # prime-rl's own record: the share of a step's finished episodes it cancelled as too
        # stale, and the rollouts it dropped
        "async_cancelled_share_per_step": [round(r.get(CANCELLED, 0.0), 3) for r in records],
        "async_dropped_per_step": [r.get(DROPPED) for r in records],
        "sync_rewards": [round(x, 3) for x in sync["rewards"]],
        "async_rewards": [None if x is None else round(x, 3) for x in overlapped["rewards"]],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", default=DEFAULT_PROFILE, help="an async_grpo profile")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument(
        "--summarise", metavar="WORK", help="only print the comparison of a finished work folder"
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    if args.summarise:
        work = Path(args.summarise)
        result = summarise(work, args.steps)
        print(json.dumps({"profile": args.profile, "work": str(work), "result": result}, indent=2))
        return

    from cortex_recipes.primerl.launch import primerl_python
    from recipes.rl.async_grpo.train import Config as AsyncConfig
    from recipes.rl.async_grpo.train import main as run_async
    from recipes.rl.math_grpo.train import Config as SyncConfig
    from recipes.rl.math_grpo.train import main as run_sync

    primerl_python()  # fail closed before the synchronous run
    work = Path(tempfile.mkdtemp(prefix="bench-async-vs-sync-"))
    sync_path = sync_profile(Path(args.profile), work / "sync-profile.json")
    run_sync(SyncConfig(profile=str(sync_path), log_path=str(work / "sync"), steps=args.steps))
    run_async(
        AsyncConfig(
            profile=args.profile,
            log_path=str(work / "async"),
            steps=args.steps,
            if_exists="overwrite",
        )
    )
    result = summarise(work, args.steps)
    print(json.dumps({"profile": args.profile, "work": str(work), "result": result}, indent=2))


if __name__ == "__main__":
    main()
