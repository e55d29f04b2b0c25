"""Finding prime-rl's environment and starting its console scripts from this project.

prime-rl (commit 559b447) needs Python 3.12 and its own verifiers commit, so it lives in an
environment of its own, beside this project's (docs/async-grpo.md says how to build it). That
environment is found through one variable, ``CORTEX_RECIPES_PRIMERL_PYTHON``: the path of its
``python``. Its scripts (``orchestrator``, ``env-server``) are started through
``import_standins.py`` so that a CPU host without torchtitan/flash-attn can import them (a host
with the real packages gets no stand-in), and by the journey through ``exit_with_parent.py``
too, so that they never outlive it.
"""

from __future__ import annotations

import os
from pathlib import Path

ENV_VAR = "CORTEX_RECIPES_PRIMERL_PYTHON"
STANDINS = Path(__file__).with_name("import_standins.py")
EXIT_WITH_PARENT = Path(__file__).with_name("exit_with_parent.py")


class PrimeRLNotFound(RuntimeError):
    """No usable prime-rl environment."""


def primerl_python(explicit: str | os.PathLike | None = None) -> Path:
    """The prime-rl environment's python: ``explicit``, else ``$CORTEX_RECIPES_PRIMERL_PYTHON``."""
    value = explicit if explicit is not None else os.environ.get(ENV_VAR)
    if not value:
        raise PrimeRLNotFound(
            f"no prime-rl environment: set {ENV_VAR} to the python of an environment with "
            "prime-rl 559b447 and verifiers a60a606 installed. On a machine that reaches "
            "GitHub: `bash recipes/rl/async_grpo/primerl/install.sh /opt/prime-rl-venv` then "
            f"`export {ENV_VAR}=/opt/prime-rl-venv/bin/python`; in the grpo image, build "
            "cortex/grpo-primerl from docker/primerl.Dockerfile, which does both "
            "(docs/async-grpo.md, 'Installing prime-rl')"
        )
    python = Path(value)
    if not python.is_file():
        raise PrimeRLNotFound(f"{ENV_VAR}={str(value)!r} is not a file")
    for script in ("orchestrator", "env-server"):
        if not (python.parent / script).is_file():
            raise PrimeRLNotFound(
                f"{ENV_VAR}={str(value)!r}: no {script!r} script beside it; is prime-rl installed "
                "in that environment?"
            )
    return python


PINS_FILE = "cortex-recipes-primerl.json"  # written by install.sh into the environment
_PACKAGES = ("prime-rl", "verifiers")
_PROBE = """
import json, importlib.metadata as m
out = {}
for name in %r:
    try:
        dist = m.distribution(name)
    except m.PackageNotFoundError:
        out[name] = None
        continue
    url = json.loads(dist.read_text("direct_url.json") or "{}")
    out[name] = {"version": dist.version, "url": url.get("url"),
                 "commit": (url.get("vcs_info") or {}).get("commit_id")}
print(json.dumps(out))
"""


def installed_commits(python: Path) -> dict:
    """Which prime-rl and verifiers the environment of ``python`` holds, by commit: what
    install.sh recorded (``PINS_FILE``, written after it checked the commits), else the
    packages' own install records (a git install names its commit; a local-path install only
    its folder, and then ``commit`` is None). Never raises: what cannot be read says so."""
    import json
    import subprocess

    found: dict = {"source": None, **dict.fromkeys(_PACKAGES)}
    pins = Path(python).parent.parent / PINS_FILE
    try:
        recorded = json.loads(pins.read_text())
        found.update(
            {name: recorded.get(name) for name in _PACKAGES}, source=recorded.get("source")
        )
    except (OSError, ValueError, AttributeError):
        pass
    try:
        probe = subprocess.run(
            [str(python), "-c", _PROBE % (_PACKAGES,)],
            capture_output=True, text=True, timeout=60, check=True,
        )  # fmt: skip
        packages = json.loads(probe.stdout)
    except (OSError, ValueError, subprocess.SubprocessError) as exc:
        packages = {"error": f"{type(exc).__name__}: {str(exc)[:200]}"}
    found["packages"] = packages
    for name in _PACKAGES:
        if found.get(name) is None and isinstance(packages.get(name), dict):
            found[name] = packages[name].get("commit")
    if found["source"] is None:
        found["source"] = (
            "the packages' install records"
            if any(found.get(n) for n in _PACKAGES)
            else f"unknown: no {PINS_FILE} and no commit in the install records"
        )
    return found


def script_command(python: Path, script: str, *args: str) -> list[str]:
    """The argv that runs prime-rl's console ``script`` with ``args`` in its environment."""
    return [str(python), str(STANDINS), script, *args]


def child_command(python: Path, script: str, *args: str) -> list[str]:
    """:func:`script_command`, for a process that must die with this one (``exit_with_parent``):
    a killed journey leaves no orchestrator writing into the run it resumes."""
    return [str(python), str(EXIT_WITH_PARENT), str(os.getpid()), str(STANDINS), script, *args]
