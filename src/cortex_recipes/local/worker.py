"""A sub-job's worker process: its model (:mod:`cortex_recipes.local.model_worker`, one class
per sub-job type); commands in arrival order, and for a sampling sub-job, continuous batching
between them (:class:`_Loop`).

Started by the server as ``python -m cortex_recipes.local.worker --fd N --spec FILE``, or
ahead of time without ``--spec`` as a spare that imports what model loading needs and then
waits for one ``assign`` message naming its sub-job
(:class:`~cortex_recipes.local.worker_spawn.SparePool`); talks over the inherited socket with
:mod:`cortex_recipes.local.protocol`. A command that fails returns an error message and leaves
the worker ready for the next one. Every reply carries the command's ``seq``, so the server may
send the next command before the last one is answered.

Invariants:
- Frame tensors are moved to the model's device once on receipt; results go back to the CPU
  before they are encoded, so the wire never carries device tensors.
- An op the sub-job's type does not answer is refused naming the ones it does.
"""

from __future__ import annotations

import argparse
import logging
import os
import queue
import socket
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

import torch
from cortex_training import wire

from cortex_recipes.local.batcher import Batcher, Limits, StepFailed
from cortex_recipes.local.errors import BackendError
from cortex_recipes.local.model_worker import ModelWorker, make_worker, to_device, to_host
from cortex_recipes.local.protocol import ConnectionClosed, recv_message, send_message
from cortex_recipes.local.specs import WorkerSpec

log = logging.getLogger("cortex_recipes.local.worker")


# Ops whose body is a DSSST1 model frame (decoded and moved to the device on receipt).
FRAME_OPS = ("forward_backward", "forward")


class _Inbox:
    """Commands read off the socket by a reader thread, so the main thread can take them
    between decode steps. ``cancel`` commands are not queued: they mark their target at once
    (the main thread drops it when it reaches it, or from the running batch). ``pause`` and
    ``resume`` are not queued either: a pause holds decoding from the next step boundary until
    a ``resume`` or its ``max_s`` runs out, whichever comes first; commands still run."""

    def __init__(self, sock: socket.socket):
        self._sock = sock
        self._queue: queue.Queue = queue.Queue()
        self._cancelled: set[int] = set()
        self._lock = threading.Lock()
        self.threads: int | None = None  # the torch threads the server last asked for
        self._paused_until: float | None = None  # time.monotonic() a pause runs out
        threading.Thread(target=self._read, name="inbox", daemon=True).start()

    def _read(self) -> None:
        while True:
            try:
                header, body = recv_message(self._sock)
            except (ConnectionClosed, OSError):
                self._queue.put(None)
                return
            if header.get("op") == "cancel":
                with self._lock:
                    self._cancelled.add(int(header["target"]))
                self._queue.put(("wake", None))
            elif header.get("op") == "threads":
                self.threads = int(header["n"])  # applied by the main thread
                self._queue.put(("wake", None))
            elif header.get("op") == "pause":
                with self._lock:
                    self._paused_until = time.monotonic() + float(header["max_s"])
                self._queue.put(("wake", None))
            elif header.get("op") == "resume":
                with self._lock:
                    self._paused_until = None
                self._queue.put(("wake", None))
            else:
                self._queue.put((header, body))

    def pause_left(self) -> float | None:
        """Seconds the pause in force still holds decoding; None when there is none (a pause
        that ran out is logged once and lifted)."""
        with self._lock:
            if self._paused_until is None:
                return None
            left = self._paused_until - time.monotonic()
            if left <= 0:
                self._paused_until = None
                log.warning("generation pause ran out without a resume; decoding again")
                return None
            return left

    def take(self, block: bool, timeout: float | None = None) -> list:
        """Every command waiting (at least one when ``block``, unless ``timeout`` seconds pass
        first); None marks a closed socket."""
        items = []
        try:
            items.append(self._queue.get(block=block, timeout=timeout if block else None))
            while True:
                items.append(self._queue.get_nowait())
        except queue.Empty:
            pass
        return [i for i in items if i is None or i[0] != "wake"]

    def cancelled(self) -> set[int]:
        with self._lock:
            return set(self._cancelled)

    def forget(self, seqs: set[int]) -> None:
        with self._lock:
            self._cancelled -= seqs


def repeated_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The blocks of the model's longest ``ModuleList`` (its decoder layers), found through any
    wrapper (PEFT included); empty when it has none."""
    lists = [m for m in model.modules() if isinstance(m, torch.nn.ModuleList) and len(m) > 1]
    return list(max(lists, key=len)) if lists else []


class _Loop:
    """The worker's main thread: commands in arrival order, generation between them.

    A training or log-probability worker runs one command at a time, as they arrive. A sampling
    worker adds generate commands to its :class:`~cortex_recipes.local.batcher.Batcher` and
    decodes one step at a time; every other command (a weight import, a forward) runs at the
    next step boundary, so none waits behind a generation. A reply carries the command's
    ``seq``; a cancelled command is answered ``cancelled`` instead of run.
    """

    def __init__(self, sock: socket.socket, worker: ModelWorker):
        self.sock = sock
        self.worker = worker
        self.table = worker.operations()
        self.inbox = _Inbox(sock)
        self.batcher = (
            Batcher(
                worker.model,
                worker.pad_id,
                Limits(
                    max_rows=worker.spec.max_num_seqs,
                    max_tokens=worker.spec.max_num_batched_tokens,
                ),
            )
            if worker.job_type == "sampling"
            else None
        )
        self.last_seq = -1
        if worker.device.type == "cpu":
            self.hook_threads(worker.model)

    def hook_threads(self, model: torch.nn.Module) -> None:
        """A long op (a forward_backward over a whole batch) takes a new thread count at the
        next decoder layer of its forward or its backward, so a trainer that started while the
        sampler was busy gets the cores back once the sampler goes idle, not at its next
        command."""
        for layer in repeated_layers(model):
            layer.register_forward_pre_hook(self._threads_hook)
            layer.register_forward_hook(self._threads_in_backward)

    def _threads_hook(self, *_: Any) -> None:
        self.apply_threads()

    def _threads_in_backward(self, _module, _args, output) -> None:
        hidden = output[0] if isinstance(output, (tuple, list)) else output
        if torch.is_tensor(hidden) and hidden.requires_grad:
            hidden.register_hook(self._threads_hook)  # runs as the layer's gradient arrives

    def reply(
        self, header: dict[str, Any], started: float | None, result=None, error=None, **extra
    ):
        message = {"id": header.get("id"), "seq": header.get("seq"), "started_at": started}
        if error is None:
            send_message(self.sock, {**message, "ok": True, **extra}, wire.dumps(to_host(result)))
        else:
            send_message(self.sock, {**message, "ok": False, "error": error, **extra})

    def run(self) -> None:
        while True:
            paused = self.inbox.pause_left()
            decoding = self.batcher is not None and self.batcher.busy and paused is None
            for item in self.inbox.take(block=not decoding, timeout=paused):
                if item is None:
                    return
                self.apply_threads()
                self.handle(*item)
            self.apply_threads()
            self.apply_cancels()
            if self.batcher is not None and self.batcher.busy and self.inbox.pause_left() is None:
                self.decode_step()

    def handle(self, header: dict[str, Any], body: bytes) -> None:
        seq = header.get("seq")
        if isinstance(seq, int):
            self.last_seq = max(self.last_seq, seq)
            if seq in self.inbox.cancelled():
                self.inbox.forget({seq})
                self.reply(header, None, error="cancelled by request", cancelled=True)
                return
        started = time.time()
        op = header.get("op")
        try:
            if op == "generate" and self.batcher is not None:
                self.batcher.add(self.worker.generate_request(header))
                return
            handler = self.table.get(op)
            if handler is None:
                known = ", ".join([*self.table, *(["generate"] if self.batcher else [])])
                raise BackendError(f"unknown worker op {op!r}; known: {known}")
            frame = to_device(wire.loads(body), self.worker.device) if op in FRAME_OPS else None
            result = handler(header, frame)
        except Exception as exc:
            self.reply(header, started, error=describe_failure(exc, op, self.worker.spec))
            return
        self.reply(header, started, result=result)

    def apply_threads(self) -> None:
        """Use the thread count the server last asked for (:mod:`cortex_recipes.local.cores`);
        set from this thread, which runs every op."""
        wanted = self.inbox.threads
        if wanted is not None and wanted != torch.get_num_threads():
            torch.set_num_threads(wanted)

    def apply_cancels(self) -> None:
        """Drop the cancelled requests that have arrived (later ones stay marked)."""
        due = {seq for seq in self.inbox.cancelled() if seq <= self.last_seq}
        if not due:
            return
        self.inbox.forget(due)
        for seq in due:
            request = self.batcher.cancel(seq) if self.batcher is not None else None
            if request is not None:
                self.reply(
                    request.header, request.started_at, error="cancelled by request", cancelled=True
                )

    def decode_step(self) -> None:
        try:
            finished = self.batcher.step(self.worker.weight_version)
        except StepFailed as failed:
            message = describe_failure(failed.cause, "generate", self.worker.spec)
            for request in failed.requests:
                self.reply(request.header, request.started_at or time.time(), error=message)
            return
        for request in finished:
            self.reply(
                request.header, request.started_at, result=self.worker.generate_result(request)
            )


def describe_failure(exc: BaseException, op: Any, spec: WorkerSpec) -> str:
    """The error message a failed command replies with (unanticipated ones are logged)."""
    if isinstance(exc, torch.cuda.OutOfMemoryError):
        torch.cuda.empty_cache()
        return (
            f"{op} ran out of GPU memory on {spec.device} (sub-job {spec.sub_job_id}, "
            f"model {spec.model_name}); send a smaller batch"
        )
    if isinstance(exc, BackendError):
        return str(exc)
    log.error("op %s failed:\n%s", op, "".join(traceback.format_exception(exc)))
    return f"{type(exc).__name__}: {exc}"


def serve(sock: socket.socket, spec: WorkerSpec) -> None:
    started = time.monotonic()
    try:
        worker = make_worker(spec)
    except Exception as exc:  # report why the sub-job could not start, then exit
        log.exception("sub-job %s failed to start", spec.sub_job_id)
        message = str(exc) if isinstance(exc, BackendError) else f"{type(exc).__name__}: {exc}"
        send_message(sock, {"ready": False, "error": message})
        return
    info = {**worker.info(), "load_s": round(time.monotonic() - started, 3)}
    send_message(sock, {"ready": True, "info": info})
    _Loop(sock, worker).run()


# Imported by a pre-started (spare) worker while it waits for its sub-job: what loading a model
# of the common architectures and wrapping it with LoRA would otherwise import at start-up.
WARM_MODULES = (
    "transformers.modeling_utils",
    "transformers.generation.utils",
    "transformers.models.auto.modeling_auto",
    "transformers.models.llama.modeling_llama",
    "transformers.models.qwen2.modeling_qwen2",
    "transformers.models.qwen3.modeling_qwen3",
    "peft",
)


def warm_imports() -> None:
    """Import :data:`WARM_MODULES` (one missing from this transformers is skipped: the import
    then happens when a model of it loads, as without a spare)."""
    import importlib

    for name in WARM_MODULES:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            print(f"spare worker: {name} not imported ({exc})", file=sys.stderr, flush=True)


def wait_for_assignment(sock: socket.socket) -> tuple[WorkerSpec, Path] | None:
    """A spare's one message: the sub-job's spec file and log file (None: the server closed the
    connection, or stopped the spare). From then on the process's stdout and stderr go to that
    sub-job's log, as a worker started for it would."""
    try:
        header, _ = recv_message(sock)
    except (ConnectionClosed, OSError):
        return None
    if header.get("op") != "assign":
        return None
    log_path = Path(header["log"])
    sys.stdout.flush()
    sys.stderr.flush()
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    return WorkerSpec.from_json(Path(header["spec"]).read_text()), log_path


def run_spare(sock: socket.socket) -> int:
    """A spare's life once its imports are done: wait for its ``assign``, then serve it."""
    assigned = wait_for_assignment(sock)
    if assigned is None:
        return 0
    spec, _ = assigned
    return run_sub_job(sock, spec)


def run_sub_job(sock: socket.socket, spec: WorkerSpec) -> int:
    logging.basicConfig(
        level=logging.INFO,
        format=f"%(asctime)s {spec.sub_job_id} %(levelname)s %(message)s",
        stream=sys.stderr,
    )
    torch.set_num_threads(spec.threads)
    serve(sock, spec)
    return 0


def run_forked_spare(fd: int, log_path: str) -> None:
    """A spare forked by :mod:`cortex_recipes.local.zygote` (its imports already done): its
    output to ``log_path``, then :func:`run_spare` on socket ``fd``; never returns."""
    from cortex_recipes.local.exits import exit_now

    code = 1
    try:
        out = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(out, 1)
        os.dup2(out, 2)
        os.close(out)
        code = run_spare(socket.socket(fileno=fd))
    except BaseException:
        traceback.print_exc()
    finally:
        exit_now(code)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--fd", type=int, required=True)
    parser.add_argument("--spec", help="the sub-job's spec file (without it: a spare worker)")
    args = parser.parse_args(argv)
    sock = socket.socket(fileno=args.fd)
    if args.spec:
        return run_sub_job(sock, WorkerSpec.from_json(Path(args.spec).read_text()))
    warm_imports()
    return run_spare(sock)


if __name__ == "__main__":
    from cortex_recipes.local.exits import exit_now

    exit_now(main())
