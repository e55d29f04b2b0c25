"""Errors the local backend reports to clients as 4xx responses or failed requests."""

from __future__ import annotations

import errno

# The words every out-of-space error of this backend starts with; a journey that sees them in a
# failed request reports a full disk instead of a traceback (cortex_recipes.run.command_line).
DISK_FULL = "the disk is full"
# How a write that ran out of space reads when it is not an OSError of its own: the C library's
# message, safetensors' wrapped Rust I/O error, and this backend's own (DISK_FULL).
_DISK_FULL_WORDS = ("No space left on device", "os error 28", DISK_FULL)


def is_disk_full(exc: BaseException | None) -> bool:
    """Whether ``exc`` (or one it was raised from) is a write that ran out of space: an
    ``OSError`` ENOSPC, safetensors' error that wraps one, or this backend's report of one
    (a failed request whose message starts with :data:`DISK_FULL`)."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
            return True
        if any(words in str(exc) for words in _DISK_FULL_WORDS):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


class BackendError(Exception):
    """A problem with the caller's input; reported with ``status`` and a message naming it."""

    status: int = 400
    code: str | None = None

    def __init__(self, message: str, *, status: int | None = None, code: str | None = None):
        super().__init__(message)
        if status is not None:
            self.status = status
        if code is not None:
            self.code = code

    @property
    def message(self) -> str:
        return str(self)


class NotFound(BackendError):
    status = 404


class Conflict(BackendError):
    status = 409
