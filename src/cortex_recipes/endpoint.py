"""Connections: ``local`` (the embedded backend in a child process), ``local-hosted`` (the same
in hosted-conformance mode) or a connection file.

A connection file is JSON, either a Cortex PAT connection
``{"host": ..., "pat": ..., "database": ..., "schema": ...}`` or a compatible server
``{"base_url": ..., "database": ..., "schema": ...}``. Journey code receives a plain
``CortexTrainingClient`` either way and never branches on which it got. Secrets are never
logged or echoed in errors.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

LOCAL = "local"
# The local backend in hosted-conformance mode (cortex_recipes.local.hosted): a journey's hosted
# path, checked on this machine.
LOCAL_HOSTED = "local-hosted"
_PAT_KEYS = {"host", "pat", "database", "schema"}
_URL_KEYS = {"base_url", "database", "schema"}
_OPTIONAL_KEYS = {"endpoint", "verify_ssl", "max_retries"}


class ConnectionConfigError(ValueError):
    """A connection file that cannot be used; the message names the file and the field."""


class BackendDied(ConnectionError):
    """The local backend's process is gone: no call to it can succeed any more."""


class EndpointUnreachable(ConnectionError):
    """A connection file's endpoint did not answer once the SDK's retries were spent; the
    message names the file, never its host or token."""


def resume_command() -> str:
    """The command this process was started with: rerunning it resumes the run (its default
    ``if_exists=resume``)."""
    import shlex
    import sys

    argv = list(getattr(sys, "orig_argv", None) or [sys.executable, *sys.argv])
    return " ".join(shlex.quote(a) for a in argv)


def guard_backend(client: Any, backend: Any) -> None:
    """Make every request of ``client`` fail at once with :class:`BackendDied` once ``backend``'s
    process has exited, instead of the SDK retrying a closed port for about a minute per call:
    the session's ``request`` checks the process before each attempt (the SDK does not retry
    this error). The message says it died, how, where its log is and the command that resumes
    the run."""
    session = getattr(client, "_session", None)
    if session is None:
        return
    send = session.request

    def request(*args, **kwargs):
        process = backend.process
        code = process.poll() if process is not None else None
        if code is not None:
            how = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
            raise BackendDied(
                f"the local backend (pid {process.pid}) {how}; its log: {backend.log_path}. "
                f"The run's checkpoints are kept; resume it with the same command: "
                f"{resume_command()}"
            )
        return send(*args, **kwargs)

    session.request = request


def read_connection_file(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError as exc:
        raise ConnectionConfigError(f"connection file {path} does not exist") from exc
    except ValueError as exc:
        raise ConnectionConfigError(f"connection file {path} is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise ConnectionConfigError(f"connection file {path} must hold a JSON object")
    required = _PAT_KEYS if "pat" in data or "host" in data else _URL_KEYS
    missing = sorted(k for k in required if not isinstance(data.get(k), str) or not data[k])
    if missing:
        raise ConnectionConfigError(
            f"connection file {path} is missing {missing}; a PAT connection needs "
            f"{sorted(_PAT_KEYS)}, a compatible server needs {sorted(_URL_KEYS)}"
        )
    unknown = sorted(set(data) - required - _OPTIONAL_KEYS)
    if unknown:
        raise ConnectionConfigError(f"connection file {path} has unknown keys {unknown}")
    for key in sorted(required & {"host", "base_url", "database", "schema", "pat"}):
        if not isinstance(data[key], str) or not data[key].strip():
            raise ConnectionConfigError(
                f"connection file {path}: {key} must be a non-empty string (value not shown)"
            )
    _check_address(path, data)
    retries = data.get("max_retries")
    if retries is not None and (
        isinstance(retries, bool) or not isinstance(retries, int) or not 0 <= retries <= 100
    ):
        raise ConnectionConfigError(
            f"connection file {path}: max_retries={retries!r}; accepted: an integer 0-100 "
            "(the SDK's retries of a failed request; default 10)"
        )
    return data


def _check_address(path: Path, data: dict[str, Any]) -> None:
    """``base_url`` an http(s) URL with a host and a valid port, ``host`` a bare host name; the
    error names the field, never the value (an account host is not printed)."""
    from urllib.parse import urlsplit

    if "base_url" in data:
        try:
            parts = urlsplit(data["base_url"])
            port_ok = parts.port is None or 0 < parts.port < 65536
        except ValueError:
            parts, port_ok = None, False
        if (
            parts is None
            or parts.scheme not in ("http", "https")
            or not parts.hostname
            or not port_ok
        ):
            raise ConnectionConfigError(
                f"connection file {path}: base_url is not an http(s) URL with a host and a valid "
                "port (value not shown)"
            )
    if "host" in data:
        host = data["host"].strip()
        if "://" in host or "/" in host or " " in host:
            raise ConnectionConfigError(
                f"connection file {path}: host must be a bare host name, without a scheme or "
                "path (value not shown)"
            )


# Local backends started ahead of connect() (prelaunch), by state folder and mode.
_launched: dict[tuple[Path, str, str | None], Any] = {}


def prelaunch(connection: str, state_dir: Path, device: str | None = None) -> None:
    """Start the local backend's process for a later :func:`connect` with the same
    ``state_dir`` and ``device``, without waiting for it: its start-up (importing torch,
    pre-starting a worker) then overlaps the journey's own (its tokenizer and data). Nothing
    for a connection file. A backend never connected is stopped when this process exits (and
    exits by itself when its parent is gone)."""
    if connection not in (LOCAL, LOCAL_HOSTED):
        return
    import atexit

    from cortex_recipes.local import LocalBackend

    key = (Path(state_dir).resolve(), connection, device)
    if key in _launched:
        return
    backend = LocalBackend(state_dir, device=device, hosted=connection == LOCAL_HOSTED)
    backend.launch()
    _launched[key] = backend
    atexit.register(backend.stop)


@contextmanager
def connect(
    connection: str = LOCAL,
    *,
    state_dir: Path | None = None,
    device: str | None = None,
    client_options: dict[str, Any] | None = None,
) -> Iterator[Any]:
    """Yield a ``CortexTrainingClient`` for ``connection`` and clean up afterwards.

    ``device`` places the local backend's sub-jobs (``auto``, ``cpu``, ``cuda``; None reads
    ``$CORTEX_RECIPES_DEVICE``, default ``auto``); a hosted endpoint places its own.
    ``client_options`` go to the client (``max_retries``, ``poll_timeout``, ...).
    """
    from cortex_training import CortexTrainingClient

    options = dict(client_options or {})

    if connection in (LOCAL, LOCAL_HOSTED):
        from cortex_recipes.local import LocalBackend

        hosted = connection == LOCAL_HOSTED
        key = (Path(state_dir).resolve(), connection, device) if state_dir else None
        backend = _launched.pop(key, None) or LocalBackend(state_dir, device=device, hosted=hosted)
        with backend:
            log.info("local backend at %s (state in %s)", backend.base_url, backend.state_dir)
            client = backend.client(**options)
            guard_backend(client, backend)
            try:
                yield client
            finally:
                client.close()
        return
    data = read_connection_file(Path(connection))
    extra = {k: data[k] for k in ("endpoint", "max_retries") if k in data}
    if "pat" in data:
        client = CortexTrainingClient.from_pat(
            host=data["host"],
            pat=data["pat"],
            database=data["database"],
            schema=data["schema"],
            verify_ssl=bool(data.get("verify_ssl", True)),
            **extra,
            **options,
        )
    else:
        client = CortexTrainingClient(
            base_url=data["base_url"],
            database=data["database"],
            schema=data["schema"],
            **extra,
            **options,
        )
    log.info("connected to a Cortex Training endpoint from %s", connection)
    try:
        yield client
    finally:
        client.close()


def sub_job_ids(job: dict) -> dict[str, str]:
    """``{job_type: sub_job_id}`` of a job as returned by ``wait_for_job``."""
    return {s["job_type"]: s["sub_job_id"] for s in job["sub_jobs"]}


def sub_job_ranks(job: dict) -> dict[str, int]:
    """``{sub_job_id: n_gpus}`` of a job description: how many data-parallel ranks each sub-job
    runs on (hosted Cortex shards a batch's rows over them; 1 when the description says none)."""
    ranks = {}
    for sub_job in job.get("sub_jobs", []):
        config = sub_job.get("training_config") or sub_job.get("inference_config") or {}
        n = config.get("n_gpus")
        ranks[sub_job["sub_job_id"]] = n if isinstance(n, int) and n >= 1 else 1
    return ranks
