"""Leaving a worker, zygote or server process (no imports beyond the standard library, so
every process module can use it without an import circle)."""

from __future__ import annotations

import logging
import os
import sys


def exit_now(code: int) -> None:
    """Leave a worker or server process without the interpreter's finalisation: with torch
    and transformers loaded it takes about 1 s, and a cancel waits for its workers to exit.
    Nothing is left to write by then (a worker writes every command's result, saves included,
    before its reply; the server has stopped its workers), so only the logs are flushed."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
