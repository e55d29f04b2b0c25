"""What `cortex-recipes journey train|smoke <name>` runs (the journey images' `train` and
`smoke` verbs): the journey's command (its default profile, or its GPU profile when a GPU is
visible; a mounted connection file), and a supervisor that stops it on SIGTERM or SIGINT within
`docker stop`'s 10 s and says what resumes it."""

from __future__ import annotations

import contextlib
import logging
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

log = logging.getLogger("cortex_recipes.cli")

CONNECTION_FILE_ENV = "CORTEX_CONNECTION_FILE"
MOUNTED_CONNECTION = Path("/run/cortex/connection.json")


def journey_command(root: Path, verb: str, journey_name: str, extra: list[str]) -> list[str]:
    """``train``: the journey's entry point with its default config, on the local backend
    unless a connection file is given ($CORTEX_CONNECTION_FILE or a file mounted at
    /run/cortex/connection.json). ``smoke``: the smoke command from journeys.toml."""
    from cortex_recipes import journeys

    journey = journeys.get_journey(root, journey_name)
    if verb == "smoke":
        command = shlex.split(journey.smoke)
        if command and command[0] in ("python", "python3"):
            command[0] = sys.executable
        return [*command, *extra]
    command = [sys.executable, "-m", journey.entry_point, *extra]
    connections = [arg for arg in extra if arg.startswith("connection=")]
    mounted = ""
    if not connections:
        mounted = os.environ.get(CONNECTION_FILE_ENV) or (
            str(MOUNTED_CONNECTION) if MOUNTED_CONNECTION.is_file() else ""
        )
        if mounted:
            command.append(f"connection={mounted}")
    local = not mounted and all(arg == "connection=local" for arg in connections)
    if local and not any(arg.startswith("profile=") for arg in extra):
        chosen = gpu_train_profile(root, journey)
        if chosen:
            command.append(f"profile={chosen}")
    return command


def _gpu_device_present() -> bool:
    """Whether an NVIDIA device is exposed to this machine or container (no torch import: the
    CPU path pays nothing)."""
    return Path("/dev/nvidiactl").exists() or Path("/proc/driver/nvidia/version").exists()


def gpu_train_profile(root: Path, journey, *, cuda: bool | None = None) -> str | None:
    """The config ``train`` runs when a GPU is visible: the journey's first local GPU profile
    whose pinned weights verify (as ``qualify auto`` picks), as a path from ``root``; None (the
    journey's default profile) otherwise. Says which and why in one log line either way."""
    from cortex_recipes import journeys
    from cortex_recipes.qualify import gpu_profiles, select_profile
    from cortex_recipes.qualify_command import _cuda_visible, weight_problems

    recipe = journeys.load_recipe(journey.path(root) / "recipe.yaml")
    if cuda is None:
        cuda = _gpu_device_present() and _cuda_visible()
    if not cuda:
        log.info("train %s: its default profile (no GPU visible)", journey.name)
        return None
    try:  # qualify's own choice: the first GPU profile whose weights verify
        name, why = select_profile(
            recipe, cuda=True, weights_ready=lambda n: weight_problems(root, journey.name, n)
        )
    except LookupError as exc:  # no GPU profile ready and no CPU qualification profile
        name, why = "", str(exc)
    if name in gpu_profiles(recipe):
        profile = next(p for p in recipe["profiles"] if p["name"] == name)
        log.info("train %s: profile %s (a GPU is visible and its weights verify)",
                 journey.name, name)  # fmt: skip
        return (journey.path(root) / profile["config"]).relative_to(root).as_posix()
    reasons = why.split(": ", 1)[-1]  # select_profile's reasons after its own label
    log.warning("train %s: a GPU is visible but its default (CPU) profile runs: %s",
                journey.name, reasons)  # fmt: skip
    return None


#: seconds a journey gets to stop after SIGTERM/SIGINT before it is killed: well under the 10 s
#: that `docker stop` waits before its SIGKILL (a journey stopped while its backend starts
#: needs the kill; `podman stop` of tito's image then took 8.6 s with 8 s here, too close)
STOP_GRACE_S = 6.0


def run_stoppable(
    command: list[str], cwd: Path, *, grace_s: float = STOP_GRACE_S, resume: str = ""
) -> int:
    """Run ``command`` and return its exit status; SIGTERM or SIGINT to this process stops it.

    The journey runs in its own process group, so a Ctrl-C reaches it once, through here: it
    gets SIGINT (its ``KeyboardInterrupt`` path stops its local backend) and ``grace_s``
    seconds, then its group gets SIGKILL. What it saved before stays: checkpoints are written
    atomically with manifests, and the local backend and prime-rl's processes exit with their
    parent. Returns 128 + the signal's number when stopped, after one line on stderr naming
    what resumes the run (``resume``). As a container's command (``docker stop`` signals the
    init, which passes it here) the container stops within ``docker stop``'s 10 s.

    The handlers are installed before the journey starts: a caught signal is reset to its
    default in the new program, while an ignored one stays ignored, and a command started in
    the background of a non-interactive shell (``nohup``, ``&`` in a script) ignores SIGINT:
    started under that, the journey would never see the SIGINT passed on."""
    received: list[tuple[int, float]] = []
    started: list[subprocess.Popen] = []

    def on_signal(signum: int, _frame: object) -> None:
        if not received:
            received.append((signum, time.monotonic()))
            if started:
                with contextlib.suppress(ProcessLookupError):
                    started[0].send_signal(signal.SIGINT)

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        proc = subprocess.Popen(command, cwd=cwd, process_group=0)
        started.append(proc)
        if received:  # a signal before the journey existed
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGINT)
        while True:
            try:
                returncode = proc.wait(timeout=0.1)
                break
            except subprocess.TimeoutExpired:
                pass
            if received and time.monotonic() - received[0][1] >= grace_s:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if not received:
        return returncode
    signum, at = received[0]
    name = signal.Signals(signum).name
    if returncode == 0:  # it finished before the stop took effect
        print(f"{name} received as the run finished; nothing to resume", file=sys.stderr)
        return 0
    print(
        f"stopped by {name} in {time.monotonic() - at:.1f} s; checkpoints saved before it are "
        f"kept in the run folder, and {resume or 'the same command'} resumes from the newest",
        file=sys.stderr,
        flush=True,
    )
    return 128 + signum


def resume_command(argv: list[str]) -> str:
    """How to resume a stopped journey: the same command. In a journey image (the entrypoint
    sets $CORTEX_JOURNEY) that is the same ``docker run``, and the run folder survives only
    under a mounted /out (the entrypoint then sets $CORTEX_RECIPES_RUNS)."""
    if os.environ.get("CORTEX_JOURNEY") and Path("/app/.image-build").is_file():
        if os.environ.get("CORTEX_RECIPES_RUNS"):
            return "the same `docker run` with the same /out mount"
        return (
            "`docker start` of this container (no directory is mounted at /out, so the run "
            'folder is inside the container, gone with --rm; mount one, -v "$PWD/out:/out", '
            "to keep runs)"
        )
    return "`" + shlex.join(["cortex-recipes", *argv]) + "`"
