"""Run the local backend: in the foreground (``cortex-recipes serve``) or as a child process.

The server binds 127.0.0.1 unless told otherwise. :class:`LocalBackend` starts it as a child
process on a free loopback port, waits until it answers, and stops it (and its workers) on exit.
In hosted-conformance mode it generates a PAT per start, hands it to the server in
``$CORTEX_RECIPES_HOSTED_TOKEN`` and gives its clients the PAT headers
(:mod:`~cortex_recipes.local.hosted_gate`); the token is never logged or written to a file.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import requests

from cortex_recipes.local import hosted_gate
from cortex_recipes.local.devices import DEVICE_ENV, DEVICE_MODES, device_mode
from cortex_recipes.local.hosted import RULES as HOSTED_RULES
from cortex_recipes.local.worker_spawn import bytecode_hint

log = logging.getLogger(__name__)

DEFAULT_HOST = "127.0.0.1"
LOCAL_DATABASE = "LOCAL"
LOCAL_SCHEMA = "PUBLIC"


def serve(
    host: str,
    port: int,
    state_dir: Path,
    *,
    ready_file: Path | None = None,
    threads: int | None = None,
    max_body_bytes: int | None = None,
    result_chunk_bytes: int | None = None,
    device: str = "auto",
    hosted: bool = False,
    api_token: str | None = None,
) -> None:
    """``api_token``: the PAT hosted mode requires (None: a new one, not shown)."""
    from cortex_recipes.local.devices import CPU, worker_visible_devices
    from cortex_recipes.local.worker_spawn import early_workers, worker_env

    # Before the imports below (torch among them): the zygote (or the spares) import meanwhile.
    zygote, early = early_workers(
        Path(state_dir) / "spares", device, worker_env(worker_visible_devices(CPU, None))
    )
    import uvicorn

    from cortex_recipes.local.app import create_app

    if host not in ("127.0.0.1", "localhost", "::1"):
        log.warning(
            "binding %s: the local backend has no authentication; anyone who can reach it can run jobs",
            host,
        )
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(128)
    bound_port = sock.getsockname()[1]
    app = create_app(
        state_dir,
        threads=threads,
        device=device,
        hosted=hosted,
        api_token=api_token,
        **({"max_body_bytes": max_body_bytes} if max_body_bytes else {}),
        **({"result_chunk_bytes": result_chunk_bytes} if result_chunk_bytes else {}),
    )
    config = uvicorn.Config(app, log_level="warning", access_log=False, timeout_keep_alive=30)
    server = uvicorn.Server(config)
    app.state.backend.registry.start_spare(early, zygote)
    if ready_file is not None:
        tmp = ready_file.with_suffix(".tmp")
        tmp.write_text(json.dumps({"host": host, "port": bound_port, "pid": os.getpid()}))
        os.replace(tmp, ready_file)
    log.info("local backend listening on http://%s:%d (state in %s)", host, bound_port, state_dir)
    if hosted:
        log.info("hosted-conformance mode: rules %s", ", ".join(HOSTED_RULES))
    hint = bytecode_hint()
    if hint:
        log.warning("%s", hint)
    try:
        server.run(sockets=[sock])
    finally:
        app.state.backend.shutdown()


class LocalBackend:
    """A local backend in a child process; use as a context manager.

    ``base_url``, ``database`` and ``schema`` are what ``CortexTrainingClient`` needs.
    ``device`` is ``auto`` (a GPU when CUDA is visible and the sub-job asks for one), ``cpu``
    or ``cuda``; None reads ``$CORTEX_RECIPES_DEVICE`` (default ``auto``). ``hosted`` starts
    it in hosted-conformance mode (:mod:`cortex_recipes.local.hosted`), with a new PAT per
    start that :meth:`client` sends.
    """

    def __init__(
        self,
        state_dir: Path | None = None,
        *,
        startup_timeout: float = 60.0,
        threads: int | None = None,
        log_path: Path | None = None,
        max_body_bytes: int | None = None,
        result_chunk_bytes: int | None = None,
        device: str | None = None,
        hosted: bool = False,
    ):
        self.device = device_mode(device)
        self.hosted = hosted
        self.max_body_bytes = max_body_bytes
        self.result_chunk_bytes = result_chunk_bytes
        self._tmp = None
        if state_dir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="cortex-local-")
            state_dir = Path(self._tmp.name)
        self.state_dir = Path(state_dir)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.startup_timeout = startup_timeout
        self.threads = threads
        self.log_path = log_path or self.state_dir / "server.log"
        self.process: subprocess.Popen | None = None
        self._token: str | None = None  # hosted mode's PAT, per start; never logged
        self.base_url = ""
        self.database, self.schema = LOCAL_DATABASE, LOCAL_SCHEMA

    def start(self) -> LocalBackend:
        """Start the server (unless :meth:`launch` already did) and wait until it answers."""
        if self.process is None:
            self.launch()
        if not self.base_url:
            self._wait_started()
        return self

    def launch(self) -> None:
        """Start the server process without waiting for it: a journey launches its backend
        before rendering its data, so that both start-ups share the machine
        (:func:`cortex_recipes.endpoint.prelaunch`); :meth:`start` then waits."""
        self._ready = self.state_dir / f"server-{os.getpid()}-{time.monotonic_ns()}.ready"
        ready = self._ready
        cmd = [
            sys.executable,
            "-m",
            "cortex_recipes.local.server",
            "--host",
            DEFAULT_HOST,
            "--port",
            "0",
            "--state-dir",
            str(self.state_dir),
            "--ready-file",
            str(ready),
            "--exit-with-parent",
            str(os.getpid()),
            "--device",
            self.device,
        ]
        env = dict(os.environ)
        env.pop(hosted_gate.TOKEN_ENV, None)
        if self.hosted:
            cmd.append("--hosted")
            self._token = hosted_gate.new_token()
            env[hosted_gate.TOKEN_ENV] = self._token  # the environment, not the command line
        if self.threads:
            cmd += ["--threads", str(self.threads)]
        if self.max_body_bytes:
            cmd += ["--max-body-bytes", str(self.max_body_bytes)]
        if self.result_chunk_bytes:
            cmd += ["--result-chunk-bytes", str(self.result_chunk_bytes)]
        with open(self.log_path, "ab") as log_file:
            self.process = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=log_file,
                start_new_session=True,
                env=env,
            )
        self._deadline = time.monotonic() + self.startup_timeout

    def _wait_started(self) -> None:
        ready, deadline = self._ready, self._deadline
        while not ready.exists():
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"local backend exited with code {self.process.returncode}; see {self.log_path}"
                )
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(
                    f"local backend did not start within {self.startup_timeout}s; see {self.log_path}"
                )
            time.sleep(0.05)
        info = json.loads(ready.read_text())
        ready.unlink()
        self.base_url = f"http://{info['host']}:{info['port']}"
        while True:
            try:
                if requests.get(f"{self.base_url}/healthz", timeout=2).ok:
                    break
            except requests.RequestException:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(f"local backend did not answer within {self.startup_timeout}s")
            time.sleep(0.05)

    def client(self, **kwargs):
        """A ``CortexTrainingClient`` of this backend; in hosted mode it sends the PAT headers,
        as ``CortexTrainingClient.from_pat`` does."""
        from cortex_training import CortexTrainingClient

        client = CortexTrainingClient(
            base_url=self.base_url, database=self.database, schema=self.schema, **kwargs
        )
        client._session.headers.update(self.auth_headers())
        return client

    def auth_headers(self) -> dict[str, str]:
        """The headers a request to this backend needs: the PAT headers in hosted mode (for
        this start's token), none in the default mode."""
        return hosted_gate.pat_headers(self._token) if self._token is not None else {}

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        self.process, self.base_url = None, ""
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self) -> LocalBackend:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="cortex-recipes serve", description="Run the local Cortex Training-compatible backend."
    )
    add_serve_arguments(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    return run_from_args(args)


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default=DEFAULT_HOST, help="bind address (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8084, help="port (0 picks a free one)")
    parser.add_argument(
        "--state-dir",
        type=Path,
        default=None,
        help="checkpoints and worker logs (default: a new temp dir)",
    )
    parser.add_argument("--ready-file", type=Path, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--exit-with-parent", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument(
        "--max-body-bytes",
        type=int,
        default=None,
        help="largest accepted request body in bytes (default 64 MiB + 64 KiB)",
    )
    parser.add_argument(
        "--result-chunk-bytes",
        type=int,
        default=None,
        help="results larger than this are delivered as result_chunk events (default 8 MiB)",
    )
    parser.add_argument(
        "--device",
        choices=DEVICE_MODES,
        default=None,
        help=f"where sub-jobs run: auto (a GPU when CUDA is visible and the sub-job asks for "
        f"n_gpus >= 1), cpu, or cuda (fails job creation without CUDA); default: ${DEVICE_ENV} "
        f"or auto",
    )
    parser.add_argument(
        "--hosted",
        action="store_true",
        help="hosted-conformance mode: refuse what hosted Cortex documents it does not accept "
        "(cortex_recipes.local.hosted; docs/local-backend.md); every request then needs the PAT "
        f"headers with the token in ${hosted_gate.TOKEN_ENV} (a random one, not shown, when unset)",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch threads per worker, fixed (default: the cores, shared among busy CPU workers)",
    )


def _exit_with_parent(parent_pid: int) -> None:
    """Stop (workers included) once the process that started us is gone, even after SIGKILL."""

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(0.5)
        log.warning("parent process %d is gone; shutting down", parent_pid)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


def run_from_args(args: argparse.Namespace) -> int:
    state_dir = args.state_dir or Path(tempfile.mkdtemp(prefix="cortex-local-"))
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    if args.exit_with_parent:
        _exit_with_parent(args.exit_with_parent)
    with contextlib.suppress(KeyboardInterrupt):
        serve(
            args.host,
            args.port,
            state_dir,
            ready_file=args.ready_file,
            threads=args.threads,
            max_body_bytes=args.max_body_bytes,
            result_chunk_bytes=args.result_chunk_bytes,
            device=device_mode(args.device),
            hosted=args.hosted,
            # Taken out of the environment either way, so that workers never inherit it.
            api_token=hosted_gate.take_token(),
        )
    return 0


if __name__ == "__main__":
    # Without the interpreter's finalisation (about 1 s with torch loaded): run_from_args has
    # stopped every worker and written every file by the time it returns.
    from cortex_recipes.local.exits import exit_now

    exit_now(main())
