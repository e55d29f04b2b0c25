"""Rollout time of the TITO journey with lockstep batching against one episode at a time.

Runs the TITO journey twice from the same profile, seeds and steps, on a fresh local backend
each: once with ``rl.play_together=1`` (every turn is its own ``generate``) and once with the
profile's ``rl.play_together`` (the turns of the playing episodes go as one ``generate``,
``cortex_recipes.tito.batching``). It prints each run's summed ``time/rollouts`` over the RL
steps and ``batched / one at a time`` (below 1.0 means lockstep batching is faster), and
whether both runs sampled the same episodes (the same mask digests). Each row keeps its own
seed, but a padded batch's float sums may differ from a single row's in the last bits, so a
sampled token can differ and ``same_episodes`` can be false without a bug; a seeded run with
the same ``play_together`` repeats exactly.

    python bench/tito_lockstep.py --steps 2
    python bench/tito_lockstep.py --profile recipes/agentic/tito/configs/local-cpu-smollm2-compare.json --warm-start-steps 4

The warm start is shortened (``--warm-start-steps``) because only the rollouts are timed.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the recipes package

DEFAULT_PROFILE = "recipes/agentic/tito/configs/local-cpu-tiny-qwen3.json"


def rollout_seconds(run_dir: Path) -> float:
    from cortex_recipes.plots import read_metrics

    return round(sum(m["time/rollouts"] for m in read_metrics(run_dir)), 3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", default=DEFAULT_PROFILE, help="a TITO profile")
    parser.add_argument("--steps", type=int, default=2, help="RL steps per run")
    parser.add_argument("--warm-start-steps", type=int, default=20)
    parser.add_argument(
        "--together", type=int, default=0, help="episodes per batch (0: the profile's)"
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)

    from recipes.agentic.tito.train import Config
    from recipes.agentic.tito.train import main as run_tito

    work = Path(tempfile.mkdtemp(prefix="bench-tito-lockstep-"))
    results = {}
    extra = [f"rl.play_together={args.together}"] if args.together else []
    for name, overrides in (("one_at_a_time", ["rl.play_together=1"]), ("batched", extra)):
        summary = run_tito(
            Config(
                profile=args.profile,
                overrides=overrides,
                log_path=str(work / name),
                steps=args.steps,
                warm_start_steps=args.warm_start_steps,
                final_eval=False,
            )
        )
        results[name] = {
            "rollout_s": rollout_seconds(work / name),
            "mask_sha256": summary["mask_sha256"],
        }
    ratio = results["batched"]["rollout_s"] / results["one_at_a_time"]["rollout_s"]
    print(
        json.dumps(
            {
                "profile": args.profile,
                "steps": args.steps,
                "one_at_a_time_rollout_s": results["one_at_a_time"]["rollout_s"],
                "batched_rollout_s": results["batched"]["rollout_s"],
                "batched/one_at_a_time": round(ratio, 3),
                "same_episodes": results["batched"]["mask_sha256"]
                == results["one_at_a_time"]["mask_sha256"],
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
