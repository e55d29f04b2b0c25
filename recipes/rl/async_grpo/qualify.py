"""Qualify an async GRPO profile on prime-rl's orchestrator: one run, interrupted twice, that
must still finish cleanly.

    python -m recipes.rl.async_grpo.qualify                       # the evidence
    python -m recipes.rl.async_grpo.qualify evidence=false        # print the checks only

prime-rl's orchestrator and env-server run in the environment ``$CORTEX_RECIPES_PRIMERL_PYTHON``
names. The run is interrupted twice:
1. once step ``kill_backend_after`` is logged (0: never), the local backend server is killed;
   the journey must reconnect by itself and resume both sides from its newest resume point;
2. once step ``kill_run_after`` is logged, the training process gets SIGKILL (its trainer
   adapter with it; prime-rl's processes die with it), and the rerun must resume both sides.
The checks (``checks.py`` beside it): reward and eval accuracy rose; the lag prime-rl
observed was logged every step (prime-rl's own line, or where an interruption lost that line,
re-derived from the episodes prime-rl shipped and marked so), stayed within ``max_off_policy_steps`` and was at least 1
somewhere; rollouts were generated while the trainer trained; every version sampled from was
applied to the sampler; every step once; both interruptions resumed. The record goes to
``evidence/<profile>.json`` and ``last_validated`` is set (``evidence=false``: print the checks
and write nothing).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import chz

from cortex_recipes.intervals import bootstrap_mean
from cortex_recipes.qualify import record_evidence, work_dir
from cortex_recipes.rl.checks import eval_gain
from cortex_recipes.rl.grpo_profile import load_grpo_profile
from recipes.rl.async_grpo.checks import primerl_checks

log = logging.getLogger("recipes.rl.async_grpo.qualify")
RECIPE_DIR = Path(__file__).parent


@chz.chz
class Config:
    profile: str = "recipes/rl/async_grpo/configs/local-cpu-smollm2-lora.json"
    kill_backend_after: int = chz.field(default=3, doc="0: no backend kill")
    kill_run_after: int = 6
    second_seed: int | None = chz.field(
        default=1, doc="a second, uninterrupted run with this seed (None: one run only)"
    )
    timeout_s: float = 3600.0
    evidence: bool = chz.field(default=True, doc="false: print the checks, write no record")


def logged_steps(run_dir: Path) -> list[int]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line)["step"] for line in path.read_text().splitlines() if line.strip()]


def backend_pids(state_dir: Path) -> list[int]:
    """The local backend server started for ``state_dir`` (its command line names it)."""
    out = subprocess.run(
        ["pgrep", "-f", f"cortex_recipes.local.server .*--state-dir {state_dir} "],
        capture_output=True,
        text=True,
    )
    return [int(p) for p in out.stdout.split()]


def wait_for_step(proc, run_dir: Path, step: int, deadline: float) -> None:
    while max(logged_steps(run_dir), default=0) < step:
        if proc.poll() is not None:
            raise RuntimeError(f"training exited with {proc.returncode} before step {step}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"step {step} not reached in time")
        time.sleep(1.0)


def finish(config: Config, profile, runs: list, checks: dict, measured: dict) -> dict:
    path = None
    if config.evidence:
        path = record_evidence(
            RECIPE_DIR, profile.name, profile.config_hash, runs, checks, metrics=measured
        )
    print(json.dumps({"checks": checks, "evidence": str(path) if path else None}, indent=2))
    return {"checks": checks, "evidence": path}


def processes_gone(run_dir: Path, timeout_s: float = 30.0) -> bool:
    """Whether the prime-rl processes the killed journey recorded are gone within
    ``timeout_s`` (they die with it: ``primerl/exit_with_parent.py``)."""
    path = run_dir / "primerl" / "processes.json"
    if not path.is_file():
        return True
    pids = json.loads(path.read_text())["pids"].values()
    deadline = time.monotonic() + timeout_s
    while any(_running(pid) for pid in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def _running(pid: int) -> bool:
    try:
        return "State:\tZ" not in Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False


def main(config: Config) -> dict:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    profile = load_grpo_profile(config.profile)
    run_dir = work_dir("qualify-async-grpo-primerl-")
    command = [
        sys.executable, "-m", "recipes.rl.async_grpo.train",
        f"profile={config.profile}", f"log_path={run_dir}",
    ]  # fmt: skip
    deadline = time.monotonic() + config.timeout_s
    events = []
    with open(run_dir / "train-1.log", "wb") as out:
        first = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
        if config.kill_backend_after:
            wait_for_step(first, run_dir, config.kill_backend_after, deadline)
            for pid in backend_pids((run_dir / "backend").resolve()):
                os.kill(pid, signal.SIGKILL)
            events.append({"event": "backend killed", "after_step": max(logged_steps(run_dir))})
            log.info("killed the backend after step %d", events[-1]["after_step"])
        wait_for_step(first, run_dir, config.kill_run_after, deadline)
        first.send_signal(signal.SIGKILL)
        first.wait()
    events.append(
        {
            "event": "training killed",
            "after_step": max(logged_steps(run_dir)),
            "primerl_processes_gone": processes_gone(run_dir),
        }
    )
    first_log = (run_dir / "train-1.log").read_text(errors="replace")
    log.info("killed training after step %d", events[-1]["after_step"])
    with open(run_dir / "train-2.log", "wb") as out:
        subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, check=True)
    run = read_run(run_dir, events, first_log)
    checks = {
        **primerl_checks(run, profile.steps, profile.orchestrator.max_off_policy_steps),
        "primerl_processes_died_with_the_journey": events[-1]["primerl_processes_gone"],
        "no_episode_cancelled_as_stale": run["stale_cancelled"] == 0,
    }
    runs, measured = [run], measures(run["summary"])
    if config.second_seed is not None:
        seed_dir = work_dir("qualify-async-grpo-primerl-seed-")
        seed_command = [*command[:-1], f"log_path={seed_dir}", f"seed={config.second_seed}"]
        with open(seed_dir / "train.log", "wb") as out:
            subprocess.run(seed_command, stdout=out, stderr=subprocess.STDOUT, check=True)
        second = read_run(seed_dir, [], "")
        second["seed"] = config.second_seed
        runs.append(second)
        tag = f"seed{config.second_seed}"
        own = primerl_checks(second, profile.steps, profile.orchestrator.max_off_policy_steps)
        checks |= {
            f"{tag}/{name}": value
            for name, value in own.items()
            if name not in ("resumed_after_process_kill",)
        }
        checks[f"{tag}/no_episode_cancelled_as_stale"] = second["stale_cancelled"] == 0
        gains = [measured["eval_accuracy_gain"]["value"]]
        for name, value in measures(second["summary"]).items():
            measured[f"{name}_{tag}"] = value
        gains.append(measured[f"eval_accuracy_gain_{tag}"]["value"])
        # the bar on every seed's point gain (the "each with a gain >= ...")
        measured["eval_accuracy_gain_every_seed"] = min(gains)
    run["seed"] = profile.seed
    return finish(config, profile, runs, checks, measured)


def read_run(run_dir: Path, events: list, first_log: str) -> dict:
    """One run's part of the record, from its folder."""
    summary = json.loads((run_dir / "summary.json").read_text())
    metrics = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x]
    run = {
        "runner": "prime-rl",
        # the prime-rl and verifiers commits that ran (install.sh's record, else pip's)
        "primerl": summary.get("primerl"),
        "summary": summary,
        "events": events,
        "reconnected_in_process": "reconnect 1/" in first_log,
        "steps_logged": [m["step"] for m in metrics],
        "rewards": summary["rewards"],
        "off_policy_max_per_step": summary["off_policy_max_per_step"],
        "lag_histogram": summary.get("lag_histogram"),
        "stale_cancelled": summary.get("stale_cancelled"),
        "correction": {
            key.removeprefix("correction/"): [m.get(key) for m in metrics]
            for key in ("correction/behave_imp_weight", "correction/behave_masked_fraction")
        },
        "clip_ratio": [m.get("clip_ratio") for m in metrics],
        # steps whose prime-rl line was lost: re-derived from its shipped episodes, or "lost"
        "primerl_record_sources": summary.get("primerl_record_sources", {}),
        "time_per_step_s": [m["time/step"] for m in metrics],
    }
    missing = [s for s, r in zip(run["steps_logged"], run["rewards"], strict=True) if r is None]
    if missing:
        raise RuntimeError(
            f"{run_dir}/metrics.jsonl: steps {missing} have no prime-rl reward "
            "(primerl/train/agg/effective/<agent>/reward/mean); their record sources: "
            f"{run['primerl_record_sources']}"
        )
    return run


def measures(summary: dict) -> dict:
    evals = summary["eval_accuracy"]
    observed = [x for x in summary["off_policy_max_per_step"] if x is not None]
    return {
        "eval_accuracy_before": bootstrap_mean("eval_accuracy_before", evals[0]["correct"]),
        "eval_accuracy_after": bootstrap_mean("eval_accuracy_after", evals[-1]["correct"]),
        "eval_accuracy_gain": eval_gain(summary),
        "reward_last_step": summary["rewards"][-1],
        "off_policy_max": max(observed, default=None),
        "overlap_fraction": summary["overlap_fraction"],
    }


if __name__ == "__main__":
    result = main(chz.entrypoint(Config))
    # a record passes only when every check holds and every measured metric is within its
    # expected range; record_evidence returns its path only then
    sys.exit(0 if result["evidence"] is not None else 1)
