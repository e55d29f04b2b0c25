"""A quiet console: what the SDK prints goes to the run's ``debug.log``, not to stdout.

cortex-training 0.0.3 prints every data-plane operation body to stdout
(``***** POST operation <path> body={...}``: for a teacher ``forward`` that is the base64 of a
whole frame on every step). Inside :func:`sdk_output_to` (which :meth:`Run.connect
<cortex_recipes.run.Run.connect>` enters for the run's connection), those lines are written
to the logger ``cortex_training.stdout`` at DEBUG and from there to the run's ``debug.log``.

The redirect is scoped to the SDK's own code: only the ``print`` that the SDK's modules call
is replaced (a module-level name that shadows the builtin there), and only while a run's
connection is open. Everything else the process prints, and the SDK's prints outside a run,
still reach stdout unchanged. Nothing replaces ``sys.stdout``.
"""

from __future__ import annotations

import builtins
import importlib
import io
import logging
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

log = logging.getLogger("cortex_training.stdout")
# Not to the console handlers above it (they take every level): only to the debug logs.
log.propagate = False

#: the SDK modules whose ``print`` calls are routed (cortex-training 0.0.3 prints in one)
SDK_MODULES = ("cortex_training.client",)
DEBUG_LOG = "debug.log"

_lock = threading.Lock()
_active = 0  # open sdk_output_to blocks, over all threads


def _sdk_print(*args, sep=" ", end="\n", file=None, flush=False) -> None:
    """The ``print`` the SDK's modules see: to the debug log while a run is connected."""
    if _active and (file is None or file is sys.stdout):
        text = io.StringIO()
        builtins.print(*args, sep=sep, end="", file=text)
        log.debug("%s", text.getvalue())
        return
    builtins.print(*args, sep=sep, end=end, file=file, flush=flush)


def _install() -> None:
    for name in SDK_MODULES:
        module = importlib.import_module(name)
        if getattr(module, "print", None) is not _sdk_print:
            module.print = _sdk_print


@contextmanager
def sdk_output_to(path: Path | None) -> Iterator[None]:
    """Route the SDK's stdout lines to the logger ``cortex_training.stdout`` (DEBUG) and, when
    ``path`` is given, append them (and nothing else) to that file, for this block."""
    global _active
    handler = None
    if path is not None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        handler = logging.FileHandler(path, encoding="utf-8")
        handler.setLevel(logging.DEBUG)
        handler.setFormatter(logging.Formatter("%(asctime)s %(threadName)s %(message)s"))
    with _lock:
        _install()
        _active += 1
        if handler is not None:
            log.addHandler(handler)
            if log.level == logging.NOTSET or log.level > logging.DEBUG:
                log.setLevel(logging.DEBUG)
    try:
        yield
    finally:
        with _lock:
            _active -= 1
            if handler is not None:
                log.removeHandler(handler)
                handler.close()
