"""Wall-clock ratio of asynchronous to synchronous GRPO, same steps and samples, one run.

For each environment latency (seconds a verifier takes per group), this runs the
synchronous example (recipes/rl/math_grpo) and the asynchronous recipe
(recipes/rl/async_grpo) from the same profile: same model, problems, seeds, batch and
group sizes, and number of steps. Each runs on its own fresh local backend. It prints the
loop times (the steps themselves, without backend start-up and the step-0 eval) and
``async / sync`` (below 1.0 means async is faster).

    python bench/async_vs_sync.py --env-latency 0 1 --steps 4
    CORTEX_RECIPES_PRIMERL_PYTHON=... python bench/async_vs_sync.py --runner prime-rl --steps 6

``--runner`` is the async journey's runner (``auto``: prime-rl's own orchestrator when
``$CORTEX_RECIPES_PRIMERL_PYTHON`` names its environment, else the builtin scheduler). On
prime-rl the async loop time is the sum of the trainer adapter's ``time/step`` (waits for each
batch included; prime-rl's start-up and the evals are not), and only ``--env-latency 0`` is
supported (its taskset has no latency knob).

The synchronous loop pays the verifier latency once per step (all groups scored at once).
The asynchronous one pays it per group, inside rollout workers that overlap with training.
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
ASYNC_KEYS = ("max_async_level", "max_off_policy_steps", "max_inflight_groups")


def sync_profile(async_profile: Path, out: Path) -> Path:
    raw = json.loads(async_profile.read_text())
    for key in ASYNC_KEYS:
        raw["orchestrator"].pop(key, None)
    raw.pop("ckpt", None)
    out.write_text(json.dumps(raw))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", default=DEFAULT_PROFILE, help="an async_grpo profile")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--env-latency", type=float, nargs="+", default=[0.0, 1.0])
    parser.add_argument("--runner", default="auto", choices=["auto", "builtin", "prime-rl"])
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)

    from cortex_recipes.plots import read_metrics
    from recipes.rl.async_grpo.train import Config as AsyncConfig
    from recipes.rl.async_grpo.train import main as run_async
    from recipes.rl.async_grpo.train import resolve_runner
    from recipes.rl.math_grpo.train import Config as SyncConfig
    from recipes.rl.math_grpo.train import main as run_sync

    runner = resolve_runner(args.runner)
    if runner == "prime-rl" and any(latency != 0 for latency in args.env_latency):
        parser.error("--runner prime-rl supports only --env-latency 0 (no latency knob)")
    work = Path(tempfile.mkdtemp(prefix="bench-async-vs-sync-"))
    sync_path = sync_profile(Path(args.profile), work / "sync-profile.json")
    rows = []
    for latency in args.env_latency:
        tag = f"latency-{latency:g}"
        sync = run_sync(
            SyncConfig(
                profile=str(sync_path),
                log_path=str(work / tag / "sync"),
                max_steps=args.steps,
                env_latency_s=latency,
            )
        )
        overlapped = run_async(
            AsyncConfig(
                profile=args.profile,
                log_path=str(work / tag / "async"),
                max_steps=args.steps,
                env_latency_s=latency,
                if_exists="overwrite",
                runner=runner,
            )
        )
        if runner == "prime-rl":
            records = read_metrics(work / tag / "async")
            async_loop = round(sum(r["time/step"] for r in records), 3)
            lag = max(overlapped["off_policy_max_per_step"])
        else:
            async_loop, lag = overlapped["loop_time_s"], overlapped["off_policy_max"]
        rows.append(
            {
                "runner": runner,
                "env_latency_s": latency,
                "steps": args.steps,
                "sync_loop_s": sync["loop_time_s"],
                "async_loop_s": async_loop,
                "ratio_async_over_sync": round(async_loop / sync["loop_time_s"], 3),
                "async_overlap_fraction": round(overlapped["overlap_fraction"], 3),
                "async_off_policy_max": lag,
                "sync_rewards": [round(x, 3) for x in sync["rewards"]],
                "async_rewards": [
                    None if x is None else round(x, 3) for x in overlapped["rewards"]
                ],
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    print(json.dumps({"profile": args.profile, "results": rows}, indent=2))


if __name__ == "__main__":
    main()
