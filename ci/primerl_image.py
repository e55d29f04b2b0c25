"""The grpo image's prime-rl variant (``cortex/grpo-primerl``), built from local clones.

``ci/images.py --primerl-clones DIR`` (or ``$CORTEX_RECIPES_PRIMERL_CLONES``) builds it after
the ``grpo`` image when DIR holds ``prime-rl/`` and ``verifiers/`` git clones that contain the
pinned commits (recipes/rl/async_grpo/primerl/requirements-git.txt): each is cloned again,
checked out at its pin, into a fresh build context, and ``docker/primerl.Dockerfile``'s
``from-clones`` target installs them. prime-rl needs CPython 3.12, which the grpo image lacks
and Debian bookworm does not ship; uv downloads it from GitHub, so on a machine without GitHub
``--primerl-python312 PREFIX`` (or ``$CORTEX_RECIPES_PRIMERL_PYTHON312``) puts a local CPython
3.12 install into the context, copied to the same prefix in the image (a shared-library build
finds its libpython there). Then the variant's ``train`` runs the tiny profile for one step
through prime-rl's own orchestrator. Without usable clones it says why it skipped, in one
line, and builds nothing (CI reaches PyPI and Debian, not GitHub).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PINS = ROOT / "recipes" / "rl" / "async_grpo" / "primerl" / "requirements-git.txt"
CLONES_ENV = "CORTEX_RECIPES_PRIMERL_CLONES"
PYTHON312_ENV = "CORTEX_RECIPES_PRIMERL_PYTHON312"
#: the variant's ``train``: the tiny profile (random init, so rewards stay 0) for one step
TRAIN = ["profile=recipes/rl/async_grpo/configs/local-cpu-tiny-qwen3-smoke.json", "steps=1"]
#: what the variant's ``train`` must print: its summary names prime-rl as the orchestrator that
#: ran, and a step was recorded
TRAIN_MARKS = ('"orchestrator": "prime-rl"', "step 1/1")


def pinned_commits(pins: Path = PINS) -> dict[str, str]:
    """``{"prime-rl": sha, "verifiers": sha}`` from the git requirements file."""
    commits = {}
    for line in pins.read_text().splitlines():
        found = re.match(r"^(prime-rl|verifiers) @ git\+https://\S+@([0-9a-f]{40})\b", line)
        if found:
            commits[found.group(1)] = found.group(2)
    missing = {"prime-rl", "verifiers"} - set(commits)
    if missing:
        raise ValueError(f"{pins}: no pinned commit for {sorted(missing)}")
    return commits


def find_clones(directory: str | os.PathLike | None, commits: dict[str, str]) -> tuple[dict, str]:
    """``({name: path}, "")`` when ``directory`` holds a clone of each project containing its
    pinned commit; else ``({}, why)``, one line naming what is missing and the fix."""
    fix = f"(pass --primerl-clones DIR or set {CLONES_ENV}=DIR, DIR/prime-rl and DIR/verifiers)"
    if not directory:
        return {}, f"no local clones of prime-rl and verifiers given {fix}"
    found = {}
    for name, commit in commits.items():
        path = Path(directory, name)
        if not (path / ".git").exists():
            return {}, f"{path} is not a git clone {fix}"
        probe = subprocess.run(
            ["git", "-C", str(path), "cat-file", "-e", f"{commit}^{{commit}}"],
            capture_output=True, check=False,
        )  # fmt: skip
        if probe.returncode != 0:
            return {}, f"{path} does not contain {name}'s pinned commit {commit[:12]}; fetch it"
        found[name] = path
    return found, ""


def check_python312(prefix: str | os.PathLike) -> Path:
    """``prefix``'s ``bin/python3.12``, refused unless it runs and is CPython 3.12."""
    python = Path(prefix, "bin", "python3.12")
    probe = subprocess.run(
        [str(python), "-c", "import sys; print(sys.implementation.name, *sys.version_info[:2])"],
        capture_output=True, text=True, check=False,
    ) if python.is_file() else None  # fmt: skip
    if probe is None or probe.returncode != 0 or probe.stdout.split() != ["cpython", "3", "12"]:
        raise ValueError(f"--primerl-python312 {prefix}: no CPython 3.12 at {python}")
    return python


def make_context(clones: dict[str, Path], commits: dict[str, str], context: Path,
                 python312: str | os.PathLike | None = None) -> None:  # fmt: skip
    """Clone each project into ``context/<name>`` and check out its pinned commit (detached),
    so the build context holds exactly the pinned trees and their .git (install.sh checks it);
    with ``python312``, that CPython prefix as ``python312/`` and its path as
    ``python312.prefix``."""
    if python312 is not None:
        check_python312(python312)
        prefix = Path(python312).resolve()
        shutil.copytree(prefix, context / "python312", symlinks=True)
        (context / "python312.prefix").write_text(f"{prefix}\n")
    for name, path in clones.items():
        target = context / name
        subprocess.run(
            ["git", "clone", "--quiet", "--no-checkout", str(path), str(target)], check=True
        )
        subprocess.run(
            ["git", "-C", str(target), "checkout", "--quiet", "--detach", commits[name]],
            check=True,
        )


def build_variant(engine: str, base_image: str, tag: str, clones: dict[str, Path],
                  commits: dict[str, str], run, python312=None) -> float:  # fmt: skip
    """Build ``tag`` from ``base_image`` (the grpo image) and the clones; returns seconds."""
    with tempfile.TemporaryDirectory(prefix="primerl-context-") as tmp:
        context = Path(tmp)
        make_context(clones, commits, context, python312)
        started = time.monotonic()
        command = [engine, "build", "--target", "from-clones", "-t", tag]
        if engine != "docker":
            command[2:2] = ["--format", "docker"]
        run([*command, "--build-arg", f"GRPO_IMAGE={base_image}",
             "-f", str(ROOT / "docker" / "primerl.Dockerfile"), str(context)])  # fmt: skip
        return time.monotonic() - started


def train_variant(engine: str, image: str) -> dict:
    """Run the variant's ``train`` on the tiny profile for one step; problems empty: passed."""
    started = time.monotonic()
    proc = subprocess.run(
        [engine, "run", "--rm", image, "train", *TRAIN], check=False, capture_output=True,
        text=True,
    )  # fmt: skip
    output = proc.stdout + proc.stderr
    result = {"primerl_train_s": round(time.monotonic() - started, 1),
              "primerl_train_rc": proc.returncode}  # fmt: skip
    problems = [] if proc.returncode == 0 else [f"train exited {proc.returncode}"]
    problems += [f"train's output does not show {mark!r}" for mark in TRAIN_MARKS
                 if mark not in output]  # fmt: skip
    result["primerl_train_problems"] = problems
    if problems:
        print(output[-4000:], flush=True)
    return result


def remove(engine: str, *tags: str) -> None:
    subprocess.run([engine, "rmi", "--force", *tags], check=False, capture_output=True)
