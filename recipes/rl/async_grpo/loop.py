"""The async GRPO journey's prime-rl processes: configs written, processes started, watched
and stopped.

``run_primerl`` takes an open run, a connected client and a GRPO profile and runs, until
``max_steps`` is published:

- one Cortex job (training + sampling sub-jobs, from the profile);
- the inference adapter (``primerl.inference``) behind the token-in gateway
  (:mod:`cortex_recipes.gateway`) on 127.0.0.1, which prime-rl uses as its vLLM server;
- the trainer adapter (``primerl.trainer``) in a thread of this process;
- prime-rl's ``env-server`` and ``orchestrator``, unchanged, in prime-rl's own environment
  (``primerl.launch``), from the ``orch.toml`` and ``env.toml`` that
  :mod:`cortex_recipes.primerl.configs` writes into the run directory; they die with this
  process, even on its SIGKILL (``primerl/exit_with_parent.py``).

The task is the offline ``cortex-arith`` verifiers taskset (``primerl/tasksets/`` beside this
file), generated with the profile's ``env`` knobs. Lag bounds are prime-rl's own:
``max_off_policy_steps`` from the profile, and prime-rl's fixed async level of one step.

Every step is recorded and every resume point written as the other journeys do it
(:mod:`cortex_recipes.primerl.records`): rerunning the same command after a kill resumes both
sides from the newest resume point (:mod:`cortex_recipes.primerl.resume`).
"""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cortex_recipes import frames
from cortex_recipes.gateway import Gateway
from cortex_recipes.models import load_tokenizer, resolve_model_path
from cortex_recipes.primerl import broadcasts, resume
from cortex_recipes.primerl.configs import (
    API_KEY_VAR,
    TASKS_FILE,
    ckpt_interval,
    env_server_toml,
    orchestrator_toml,
    write_tasks,
)
from cortex_recipes.primerl.inference import InferenceAdapter
from cortex_recipes.primerl.launch import child_command, primerl_python
from cortex_recipes.primerl.records import RUNNER, RunRecorder, overlap_fraction, summary_fields
from cortex_recipes.primerl.trainer import TrainerAdapter, TrainerAdapterConfig
from cortex_recipes.reconnect import is_recoverable
from cortex_recipes.run import CheckpointError

log = logging.getLogger(__name__)


def tasksets_dir() -> Path:
    """The journey's taskset folder (beside this file: the checkout, or ``/app`` in an image)."""
    return Path(__file__).resolve().parent / "primerl" / "tasksets"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_primerl(client, profile, run, *, max_steps: int, job_id: str,
                state: dict[str, Any] | None = None, python: str | None = None,
                timeout_s: float = 3600.0, begin: Callable[[], None] | None = None,
                evaluate_last: Callable[[], float] | None = None) -> dict[str, Any]:  # fmt: skip
    """Train up to ``max_steps`` with prime-rl's orchestrator; returns the summary fields.

    ``run.resume`` (a resume point this function wrote) makes it resume after that step;
    ``state`` is carried in every resume point (the journey's eval history); ``begin`` runs
    once before a new run's first version is published, while prime-rl's processes start
    (the evaluation before training); ``evaluate_last`` is :class:`RunRecorder`'s.
    """
    prime = primerl_python(python)
    work = run.path / "primerl"
    output_dir = work / "outputs"
    work.mkdir(parents=True, exist_ok=True)
    resume.wait_for_earlier_processes(work)
    point = run.resume
    if point is not None and point.get("runner") != RUNNER:
        raise CheckpointError(
            f"{run.path}/checkpoints/step_{point['step']}: written by runner="
            f"{point.get('runner', 'builtin')!r} (this project's retired scheduler), not by "
            f"{RUNNER!r}; it cannot be resumed: pass if_exists=overwrite or another run_name"
        )
    resume_step = point["step"] if point is not None else None
    restored = resume.restore(output_dir, resume_step, point and point["trainer"])
    started = time.monotonic()
    counters, overlap = _train(client, profile, run, prime=prime, work=work,
                               output_dir=output_dir, max_steps=max_steps, job_id=job_id,
                               resume_step=resume_step, state=state or {},
                               timeout_s=timeout_s, begin=begin,
                               evaluate_last=evaluate_last)  # fmt: skip
    return {
        **summary_fields(run, work, max_steps),
        # This command's segment: training time during which rollouts were being generated.
        "overlap_fraction": round(overlap, 4),
        "resumed_from_step": resume_step,
        "retracted": {k: v for k, v in restored.items() if k != "resume_step"},
        "inference_counters": counters,
        "primerl_dir": str(work),
        "wall_time_s": round(time.monotonic() - started, 1),
    }


def _train(client, profile, run, *, prime: Path, work: Path, output_dir: Path, max_steps: int,
           job_id: str, resume_step: int | None, state: dict[str, Any],
           timeout_s: float, begin: Callable[[], None] | None = None,
           evaluate_last: Callable[[], float] | None = None) -> tuple[dict[str, int], float]:  # fmt: skip
    tokenizer = load_tokenizer(profile.model)
    interval = ckpt_interval(profile)
    recorder = RunRecorder(run, output_dir, interval=interval, max_steps=max_steps, state=state,
                           evaluate_last=evaluate_last)  # fmt: skip
    adapter, trainer = adapters(
        client, job_id, profile, output_dir, max_steps=max_steps, pad_id=frames.pad_id(tokenizer),
        learning_rate=profile.learning_rate, on_step=recorder,
    )  # fmt: skip

    def start_trainer() -> int:
        """The version prime-rl syncs first, live in this job (before it can ask for it)."""
        version = trainer.start()
        if version != (resume_step or 0):
            raise CheckpointError(
                f"{output_dir}/broadcasts: the trainer adapter resumed at version {version}, "
                f"the run's resume point is step {resume_step or 0}"
            )
        if resume_step is None and not recorder.save_point(0):
            raise RuntimeError(f"{output_dir}: version 0 was not published")
        return version

    if resume_step is not None and start_trainer() >= max_steps:
        return dict(adapter.counters), 0.0  # killed after its last resume point: all is loaded
    failures: list[BaseException] = []

    def train() -> None:
        try:
            trainer.train_steps()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller below
            failures.append(exc)

    env = {**os.environ, API_KEY_VAR: "local", "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": str(tasksets_dir())}  # fmt: skip
    tasks_path = write_tasks(profile, work / TASKS_FILE)
    thread = threading.Thread(target=train, name="trainer-adapter", daemon=True)
    with Gateway(adapter.app) as gateway:
        port = free_port()
        (work / "orch.toml").write_text(
            orchestrator_toml(
                profile,
                model_dir=resolve_model_path(profile.model),
                base_url=gateway.base_url,
                output_dir=output_dir,
                port=port,
                max_steps=max_steps,
                tasks_path=tasks_path,
                resume_step=resume_step or None,
            )  # fmt: skip
        )
        (work / "env.toml").write_text(
            env_server_toml(
                profile, output_dir=work / "env-server", port=port, tasks_path=tasks_path
            )
        )
        with (
            open(work / "env-server.log", "ab") as env_log,
            open(work / "orchestrator.log", "ab") as orch_log,
        ):
            # prime-rl's processes start first: their start-up (tens of seconds of imports)
            # overlaps the evaluation before training; the orchestrator then waits for the
            # trainer's first version, published after that evaluation, before it samples.
            env_server = subprocess.Popen(
                child_command(prime, "env-server", "@", str(work / "env.toml")),
                env=env, stdout=env_log, stderr=subprocess.STDOUT,
            )  # fmt: skip
            try:
                orchestrator = subprocess.Popen(
                    child_command(prime, "orchestrator", "@", str(work / "orch.toml")),
                    env=env, stdout=orch_log, stderr=subprocess.STDOUT,
                )  # fmt: skip
                recorder.alive = lambda: orchestrator.poll() is None
                resume.record_processes(
                    work, {"env-server": env_server.pid, "orchestrator": orchestrator.pid},
                    marker=str(work),
                )  # fmt: skip
                try:
                    if resume_step is None:
                        if begin is not None:
                            begin()
                        start_trainer()
                    run.track_steps(max_steps)  # the progress display every journey shows
                    thread.start()
                    returncode = _wait(
                        orchestrator, failures, timeout_s,
                        backend_check=lambda: backend_lost(client, job_id),
                    )  # fmt: skip
                finally:
                    if orchestrator.poll() is None:
                        orchestrator.kill()
                        orchestrator.wait()
            finally:
                env_server.terminate()
                try:
                    env_server.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    env_server.kill()
        trainer.stop.set()  # no more rollout files or syncs can come
        if thread.is_alive():
            thread.join(timeout=600)
    failures = [f for f in failures if not isinstance(f, broadcasts.Stopped)]
    if failures:  # the trainer adapter's error explains an orchestrator stopped because of it
        raise failures[0]
    if returncode != 0:
        lost = backend_lost(client, job_id)
        raise RuntimeError(
            f"prime-rl's orchestrator exited with {returncode}"
            + (f" after the backend was lost ({type(lost).__name__})" if lost else "")
            + f"; its log: {work / 'orchestrator.log'}"
        ) from lost
    if thread.is_alive():
        raise RuntimeError(f"the trainer adapter did not finish; see {work}")
    overlap = overlap_fraction(trainer.train_intervals, adapter.generation_intervals)
    return dict(adapter.counters), overlap


def adapters(client, job_id: str, profile, output_dir: Path, *, max_steps: int, pad_id: int,
             learning_rate: float, **trainer_options: Any) -> tuple[InferenceAdapter, TrainerAdapter]:  # fmt: skip
    """The two adapters prime-rl talks to, on ``job_id``'s sampler and trainer: the inference
    adapter (its vLLM server) and the trainer adapter (its trainer), both over ``output_dir``."""
    inference = InferenceAdapter(
        client, job_id, model=str(resolve_model_path(profile.model)),
        max_model_len=profile.max_seq_len, output_dir=output_dir,
        weight_format=profile.weight_format, base_seed=profile.seed,
    )  # fmt: skip
    trainer = TrainerAdapter(
        client,
        TrainerAdapterConfig(
            output_dir=output_dir,
            job_id=job_id,
            max_steps=max_steps,
            pad_id=pad_id,
            loss_config=profile.loss_config(),
            learning_rate=learning_rate,
            lr_schedule=profile.lr_schedule,
            **trainer_options,
        ),  # fmt: skip
    )
    return inference, trainer


def backend_lost(client, job_id: str) -> BaseException | None:
    """The recoverable error (connection refused, 5xx, ...) a call to the backend gives now, or
    None when the backend answers: an orchestrator that died because the backend went away is
    then reported as that (the journey reconnects and resumes), any other death as itself."""
    try:
        client.get_job(job_id)
    except Exception as exc:  # noqa: BLE001 - classified and returned, not swallowed
        return exc if is_recoverable(exc) else None
    return None


BACKEND_CHECK_S = 15.0  # how often the journey asks the backend whether it is still there


def _wait(process: subprocess.Popen, failures: list, timeout_s: float,
          backend_check=None, check_every_s: float = BACKEND_CHECK_S) -> int | None:  # fmt: skip
    """The orchestrator's exit status; None when the trainer adapter failed first or the backend
    was lost (the caller then stops the orchestrator). Raises ``TimeoutError`` after
    ``timeout_s``.

    ``backend_check`` (returns the recoverable error a backend call gives now, or None) runs
    every ``check_every_s``: with the backend gone, prime-rl's orchestrator retries its
    rollouts for ever and the trainer adapter waits for a batch that cannot come, so nothing
    else would notice. Two failed checks in a row count as lost: the error goes to ``failures``
    and the journey reconnects."""
    deadline = time.monotonic() + timeout_s
    next_check = time.monotonic() + check_every_s
    missed = 0
    while not failures:
        try:
            return process.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"prime-rl's orchestrator did not finish in {timeout_s:.0f} s"
                ) from None
        if backend_check is not None and time.monotonic() >= next_check:
            lost = backend_check()
            missed = missed + 1 if lost is not None else 0
            if missed >= 2:
                log.warning("the backend is not answering (%s: %s)", type(lost).__name__, lost)
                failures.append(lost)
            next_check = time.monotonic() + check_every_s
    return None
