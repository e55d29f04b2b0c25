"""Run a Python script that dies with the process that started it, even on that process's SIGKILL.

    <prime-rl python> exit_with_parent.py <parent pid> <script.py> [args...]

The async GRPO journey starts prime-rl's orchestrator and env-server as child processes. A
SIGKILL of the journey cannot stop them, and a surviving orchestrator would go on writing
rollout files and checkpoints into the run that the rerun is resuming. So each of them is
started through this file: on Linux it asks the kernel for SIGKILL when its parent dies
(``prctl(PR_SET_PDEATHSIG)``); everywhere a daemon thread also watches the parent's pid and
kills this process once it changes. The env-server's own worker processes follow it
(verifiers arms each with a death pipe). It exits at once if the parent is already gone.

Like ``import_standins.py`` it runs under prime-rl's own Python, so it uses the standard
library only and is passed to that Python by path (``cortex_recipes.primerl.launch``).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import runpy
import signal
import sys
import threading
import time

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
POLL_S = 0.5


def arm(parent: int) -> None:
    """Die with ``parent``: a kernel death signal where there is one, and a watching thread."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL))
    if os.getppid() != parent:  # the parent died before the death signal was armed
        os._exit(1)

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(POLL_S)
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


def main(argv: list[str]) -> int:
    if len(argv) < 2 or not argv[0].isdigit():
        print("usage: exit_with_parent.py <parent pid> <script.py> [args...]", file=sys.stderr)
        return 2
    arm(int(argv[0]))
    sys.argv = argv[1:]
    runpy.run_path(argv[1], run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
