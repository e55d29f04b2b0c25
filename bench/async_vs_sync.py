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
not). ``ratio_steps_2_on`` compares steps 2..N of both, once both loops run, and
``ratio_end_to_end`` the two commands as a user waits for them (start-up, the evaluations
before and after training, saves: everything).

The latency sweep (``--latencies 0,1,2,4``) runs both loops once per value of
``env.latency_s``: the seconds every rollout waits on its environment before it is scored, as
a sandbox or tool call makes it wait. Rollouts wait concurrently in both loops, as a real
environment server lets them: the synchronous loop waits once per step, after sampling and
before training; the async journey's taskset waits inside each rollout on prime-rl's
env-server, where the waits overlap each other, sampling and training. ``--set key=value``
overrides the profile for both loops (e.g. a smaller batch), and ``--out FILE`` writes the
results as JSON.

    CORTEX_RECIPES_PRIMERL_PYTHON=... python bench/async_vs_sync.py --steps 6 \
        --latencies 0,1,2,4 --out bench/results/<dir>/async_vs_sync_latency.json
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the recipes package

from cortex_recipes.profiles import apply_overrides, parse_value  # noqa: E402
from cortex_recipes.rl.grpo_profile import GRPOProfile  # noqa: E402

DEFAULT_PROFILE = "recipes/rl/async_grpo/configs/local-cpu-smollm2-lora.json"
ASYNC_KEYS = ("max_off_policy_steps", "max_inflight_groups")
# The async profile's off-policy correction: on the synchronous loop's on-policy rollouts the
# proximal, behaviour and current policies are one, so it is the identity there (and its
# version-interpolated proximal policy needs per-row versions the sync loop does not send).
CORRECTION_KEYS = ("use_decoupled_loss", "prox_logp_method", "behav_imp_weight_cap")
CANCELLED = "primerl/train/agg/all/cancelled/mean"
DROPPED = "primerl/off_policy/dropped"


def profile_pair(
    async_profile: Path, work: Path, overrides: list[str], latency: float
) -> tuple[Path, Path]:
    """The async profile with the ``key=value`` ``overrides`` (checked as the command line's
    are) and ``env.latency_s`` applied, and its synchronous twin (the same without the
    async-only orchestrator keys and checkpoints), both in ``work``."""
    raw = json.loads(async_profile.read_text())
    raw = apply_overrides(GRPOProfile, raw, [*overrides, f"env.latency_s={latency}"], "--set")
    work.mkdir(parents=True, exist_ok=True)
    async_path = work / "async-profile.json"
    async_path.write_text(json.dumps(raw))
    return async_path, sync_profile(async_path, work / "sync-profile.json")


def sync_profile(async_profile: Path, out: Path) -> Path:
    raw = json.loads(async_profile.read_text())
    for key in ASYNC_KEYS:
        raw["orchestrator"].pop(key, None)
    for key in CORRECTION_KEYS:
        raw.get("loss", {}).pop(key, None)
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


def run_pair(profile: Path, work: Path, steps: int, overrides: list[str], latency: float) -> dict:
    """Both loops on fresh backends at one ``latency``; their comparison."""
    from recipes.rl.async_grpo.train import Config as AsyncConfig
    from recipes.rl.async_grpo.train import main as run_async
    from recipes.rl.math_grpo.train import Config as SyncConfig
    from recipes.rl.math_grpo.train import main as run_sync

    async_path, sync_path = profile_pair(profile, work, overrides, latency)
    t0 = time.monotonic()
    run_sync(SyncConfig(profile=str(sync_path), log_path=str(work / "sync"), steps=steps))
    t1 = time.monotonic()
    run_async(
        AsyncConfig(
            profile=str(async_path),
            log_path=str(work / "async"),
            steps=steps,
            if_exists="overwrite",
        )  # fmt: skip
    )
    t2 = time.monotonic()
    # The whole command each: backend start-up, both evaluations, training, saves, shutdown.
    whole = {"sync_end_to_end_s": round(t1 - t0, 1), "async_end_to_end_s": round(t2 - t1, 1)}
    whole["ratio_end_to_end"] = round(whole["async_end_to_end_s"] / whole["sync_end_to_end_s"], 3)
    return {"env_latency_s": latency, **summarise(work, steps), **whole}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", default=DEFAULT_PROFILE, help="an async_grpo profile")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument(
        "--latencies", default="0", help="comma-separated env.latency_s values (seconds)"
    )
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE",
        help="a profile override for both loops (dotted key), e.g. orchestrator.batch_size=16",
    )  # fmt: skip
    parser.add_argument("--out", help="also write the results to this JSON file")
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

    overrides = {}
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep or not key:
            parser.error(f"--set {item!r}: expected KEY=VALUE")
        overrides[key] = parse_value(value)  # for the report; the profiles take args.set
    latencies = [float(x) for x in args.latencies.split(",") if x.strip()]
    if not latencies or any(x < 0 for x in latencies):
        parser.error(f"--latencies {args.latencies!r}: seconds >= 0, comma-separated")
    primerl_python()  # fail closed before the synchronous run
    work = Path(tempfile.mkdtemp(prefix="bench-async-vs-sync-"))
    results = []
    for latency in latencies:
        result = run_pair(Path(args.profile), work / f"latency-{latency:g}", args.steps,
                          args.set, latency)  # fmt: skip
        results.append(result)
        print(json.dumps(result), flush=True)
    report = {
        "profile": args.profile,
        "overrides": overrides,
        "steps": args.steps,
        "work": str(work),
        "ratio_by_latency": {
            f"{r['env_latency_s']:g}": r["ratio_async_over_sync"] for r in results
        },
        "ratio_end_to_end_by_latency": {
            f"{r['env_latency_s']:g}": r["ratio_end_to_end"] for r in results
        },
        "results": results,
    }
    text = json.dumps(report, indent=2)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
