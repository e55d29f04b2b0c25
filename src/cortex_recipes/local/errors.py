"""Errors the local backend reports to clients as 4xx responses or failed requests."""

from __future__ import annotations

# The words every out-of-space error of this backend starts with; a journey that sees them in a
# failed request reports a full disk instead of a traceback (cortex_recipes.run.command_line).
DISK_FULL = "the disk is full"


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
