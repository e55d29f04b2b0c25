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
            "prime-rl 559b447 and verifiers a60a606 installed (docs/async-grpo.md, 'Installing "
            "prime-rl')"
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


def script_command(python: Path, script: str, *args: str) -> list[str]:
    """The argv that runs prime-rl's console ``script`` with ``args`` in its environment."""
    return [str(python), str(STANDINS), script, *args]


def child_command(python: Path, script: str, *args: str) -> list[str]:
    """:func:`script_command`, for a process that must die with this one (``exit_with_parent``):
    a killed journey leaves no orchestrator writing into the run it resumes."""
    return [str(python), str(EXIT_WITH_PARENT), str(os.getpid()), str(STANDINS), script, *args]
