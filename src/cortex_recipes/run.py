"""One run lifecycle for every journey: run directory, resume, connection, jobs, train step, save.

A run lives in ``runs/<journey>/<run name>/`` (the run name defaults to the profile name;
``log_path=`` names any other folder) and keeps everything after it ends:

- ``config.json``: the journey config, the profile, its ``config_hash``, the code revision;
- ``rollouts.jsonl``: what RL, OPD and TITO runs sampled (:mod:`cortex_recipes.completions`);
- ``metrics.jsonl``: one JSON object a step, checked against the journey's record in
  ``metrics_schema.json`` before it is written (:mod:`cortex_recipes.metrics`,
  docs/metrics.md); ``checkpoints.jsonl``: one per save;
- ``checkpoints/step_N/state.json``: what resume needs, naming the trainer checkpoint saved at
  the same step (written atomically: temp file, fsync, rename; a step folder without the file
  is incomplete and ignored);
- ``summary.json``: written when the run finishes;
- ``debug.log``: what the SDK prints (every operation body), kept off the console
  (:mod:`cortex_recipes.console`);
- ``backend/``: the local backend's state (trainer checkpoints, worker and server logs) when
  the connection is ``local``.

Invariants this module keeps:

- An existing run is deleted only with ``if_exists=overwrite``. ``fail`` refuses to touch it.
  ``resume`` (the default) continues after its newest checkpoint, and only when that
  checkpoint was written with a profile of the same hash; a finished run is returned as it
  is; an unfinished run with no checkpoint is refused rather than started over.
- A resumed run keeps the records of the steps up to its checkpoint and drops later ones, so
  every step appears exactly once.
- Every job a run creates is cancelled when the connection closes, on failure too.
- An SDK call that fails with an HTTP error raises
  :class:`~cortex_recipes.cortex_client.CortexCallError` naming the operation, the sub-job and
  the server's own ``message`` and ``code`` (:meth:`Run.connect` gives the journey an
  :class:`~cortex_recipes.cortex_client.ExplainedClient`).

Every journey's command-line ``Config`` subclasses :class:`RunConfig`, which holds the fields
they share (``profile``, ``connection``, ``run_name``, ``log_path``, ``if_exists``,
``overrides``, ``progress``, and the optional trackers ``tensorboard_dir`` and
``wandb_project``); a journey adds its own and sets its default profile with
:func:`profile_field`. ``metrics.jsonl`` is the source of truth; the trackers
(:mod:`cortex_recipes.trackers`) get each record after it is written, and a tracker failure
logs a warning and never stops the run.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import chz

from cortex_recipes import profiles
from cortex_recipes.cortex_client import ExplainedClient
from cortex_recipes.local.errors import is_disk_full
from cortex_recipes.metrics import validate_record
from cortex_recipes.provenance import git_revision
from cortex_recipes.run_store import (  # noqa: F401 - CheckpointError is the run's error
    CheckpointError,
    RunCheckpoints,
    write_json_atomic,
)
from cortex_recipes.trackers import Trackers, open_trackers

log = logging.getLogger(__name__)
# The run folder this process opened last (cortex_recipes.run.command_line writes a user
# error's traceback into its debug.log).
_LAST_OPENED: Path | None = None


def last_opened() -> Path | None:
    return _LAST_OPENED


IF_EXISTS = ("resume", "overwrite", "fail")
RUNS_ROOT = Path("runs")
RUNS_ENV = "CORTEX_RECIPES_RUNS"


def runs_root() -> Path:
    """Where runs live: ``$CORTEX_RECIPES_RUNS`` (an image's ``/out/runs``), else ``runs/``."""
    return Path(os.environ.get(RUNS_ENV) or RUNS_ROOT)


_RECORDS = ("config.json", "metrics.jsonl", "checkpoints.jsonl", "summary.json")
_LOGS = ("debug.log", "rollouts.jsonl")  # removed with the run; on their own no run


# -- the command line every journey shares --------------------------------------------------


def profile_field(default: str) -> Any:
    """The ``profile`` field of a journey's ``Config``, defaulting to that journey's profile."""
    return chz.field(
        default=default, doc="the profile file (JSON or TOML) under the recipe's configs/"
    )


@chz.chz
class RunConfig:
    """The run fields of every journey's ``Config``: which profile, which backend, which run
    folder and what to do when it already holds a run, and how many steps to train. A
    journey's ``Config`` subclasses this, sets ``profile: str = profile_field(DEFAULT_PROFILE)``
    and adds its own fields."""

    profile: str = chz.field(doc="the profile file (JSON or TOML) under the recipe's configs/")
    connection: str = chz.field(
        default="local",
        doc="'local' (the embedded backend), 'local-hosted' (the same, in hosted-conformance "
        "mode) or a connection file for a Cortex endpoint",
    )
    run_name: str = chz.field(
        default="", doc="default: the profile name; the run lives in runs/<journey>/<run_name>"
    )
    log_path: str = chz.field(default="", doc="a run folder other than runs/<journey>/<run_name>")
    if_exists: str = chz.field(
        default="resume", doc="resume | overwrite | fail, when the run folder holds a run"
    )
    steps: int | None = chz.field(
        default=None,
        doc="train this many steps (an integer >= 1) instead of the profile's steps",
        validator=profiles.optional_at_least(1),
    )
    overrides: tuple[str, ...] = chz.field(
        default=(), doc="profile overrides: the command line's other key=value"
    )
    progress: bool = chz.field(
        default=True,
        doc="live progress bars on stderr when it is a terminal (CORTEX_RECIPES_PROGRESS=0: off)",
    )
    tensorboard_dir: str = chz.field(
        default="", doc="also write TensorBoard event files to <dir>/<run folder name>/"
    )
    wandb_project: str = chz.field(
        default="", doc="also log to this W&B project (WANDB_MODE=offline works without network)"
    )

    def steps_for(self, profile: Any) -> int:
        """The steps this run trains: ``steps`` when given, else the profile's."""
        return profile.steps if self.steps is None else self.steps

    def open_run(self, journey: str, profile: Any) -> Run:
        """:func:`open_run` for this config's ``log_path``, ``run_name`` and ``if_exists``,
        once the whole configuration passed :func:`cortex_recipes.preflight.check`."""
        from cortex_recipes import preflight

        preflight.check(self, profile, run_path(journey, profile, self.log_path, self.run_name))
        return open_run(
            journey, profile, self,
            log_path=self.log_path, run_name=self.run_name, if_exists=self.if_exists,
            steps=self.steps,
        )  # fmt: skip


# -- the run directory ----------------------------------------------------------------------


class Run:
    """An open run directory. Use :func:`open_run`; journeys never build paths themselves."""

    def __init__(
        self, path: Path, *, config_hash: str, resume: dict[str, Any] | None, journey: str = ""
    ):
        self.path = Path(path)
        #: the journey name, which also names its record in metrics_schema.json
        self.journey = journey
        self.config_hash = config_hash
        self.checkpoints = RunCheckpoints(self.path / "checkpoints")
        #: the newest checkpoint's state when this run resumes, else None
        self.resume = resume
        self.resumed_from_step: int | None = resume["step"] if resume else None
        self.finished: dict[str, Any] | None = None
        self._progress: Any = None
        #: TensorBoard / W&B sinks fed after metrics.jsonl (cortex_recipes.trackers)
        self.trackers = Trackers()

    @property
    def backend_dir(self) -> Path:
        return self.path / "backend"

    def _append(self, name: str, record: dict[str, Any]) -> None:
        """One JSON line, whole or not at all: a write that fails (a full disk) is cut back,
        so the file never ends in half a record."""
        line = (json.dumps(record, sort_keys=True) + "\n").encode()
        with open(self.path / name, "ab", buffering=0) as f:
            start = f.seek(0, os.SEEK_END)
            try:
                written = 0
                while written < len(line):
                    written += f.write(line[written:])
            except OSError:
                with suppress(OSError):  # a device file cannot be truncated: it kept nothing
                    f.truncate(start)
                raise

    def metrics(self, **record: Any) -> None:
        """Append one step's record, checked against this journey's metrics schema."""
        self.record_metrics(record)

    def record_metrics(self, record: dict[str, Any], *, schema: str | None = None) -> None:
        """Append ``record`` once it matches ``schema`` (default: the journey's record in
        metrics_schema.json); a record that does not raises naming the key, and nothing is
        written."""
        validate_record(schema or self.journey, record)
        self._append("metrics.jsonl", record)
        self.trackers.log(record)
        if self._progress is not None:
            self._progress.update(record)

    def track_steps(self, total: int) -> None:
        """Show a training-step bar of ``total`` steps (when progress is on, see
        :mod:`cortex_recipes.progress`), advanced by each metrics record's ``step``."""
        from cortex_recipes.progress import StepProgress

        self.close_progress()
        done = max((m.get("step", 0) for m in self.read_metrics()), default=0)
        self._progress = StepProgress(total, desc=f"{self.journey} {self.path.name}", done=done)

    def close_progress(self) -> None:
        if self._progress is not None:
            self._progress.close()
            self._progress = None

    def read_metrics(self) -> list[dict[str, Any]]:
        path = self.path / "metrics.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def checkpoint(self, **record: Any) -> None:
        self._append("checkpoints.jsonl", {**record, "time": time.time()})

    def summary(self, data: dict[str, Any]) -> dict[str, Any]:
        self.close_progress()
        data = {**data, "run_dir": str(self.path), "git_revision": git_revision()}
        write_json_atomic(self.path / "summary.json", data)
        self.trackers.close()
        return data

    def reload_resume(self) -> dict[str, Any] | None:
        """Make the newest checkpoint that verifies the resume point (again: after a reconnect
        too) and drop the records of later steps."""
        latest = self.checkpoints.latest_verified(self.backend_dir)
        if latest is not None:
            for name in ("metrics.jsonl", "checkpoints.jsonl", "rollouts.jsonl"):
                self._truncate(name, latest["step"])
            (self.path / "summary.json").unlink(missing_ok=True)
        self.resume = latest
        self.resumed_from_step = latest["step"] if latest else None
        return latest

    def _truncate(self, name: str, step: int) -> None:
        path = self.path / name
        if not path.exists():
            return
        kept = [
            line
            for line in path.read_text().splitlines()
            if line.strip() and json.loads(line).get("step", 0) <= step
        ]
        tmp = self.path / f".{name}.tmp"
        tmp.write_text("".join(f"{line}\n" for line in kept))
        os.replace(tmp, path)

    def prelaunch(self, connection: str) -> None:
        """Start the local backend of a later :meth:`connect` now, so that it starts while the
        journey loads its tokenizer and data (:func:`cortex_recipes.endpoint.prelaunch`);
        nothing for a connection file."""
        from cortex_recipes.endpoint import prelaunch

        prelaunch(connection, self.backend_dir)

    @contextmanager
    def connect(
        self, connection: str, *, client_options: dict[str, Any] | None = None
    ) -> Iterator[Any]:
        """A client whose errors name the server's message, and whose jobs are cancelled when
        the block ends, however it ends. A local backend keeps its state in ``backend/``; the
        SDK's stdout lines go to ``debug.log`` while the block is open."""
        from cortex_recipes.console import DEBUG_LOG, sdk_output_to
        from cortex_recipes.endpoint import LOCAL, LOCAL_HOSTED, connect
        from cortex_recipes.progress import logging_above_bars

        local = connection in (LOCAL, LOCAL_HOSTED)
        state_dir = self.backend_dir if local else None
        with (
            sdk_output_to(self.path / DEBUG_LOG),
            connect(connection, state_dir=state_dir, client_options=client_options) as client,
        ):
            explained = ExplainedClient(client, connection=None if local else connection)
            try:
                with logging_above_bars():
                    yield explained
            finally:
                self.close_progress()
                explained.cancel_open_jobs()


def run_path(journey: str, profile: Any, log_path: str = "", run_name: str = "") -> Path:
    """``log_path``, else ``runs/<journey>/<run_name or the profile's name>``."""
    return Path(log_path) if log_path else runs_root() / journey / (run_name or profile.name)


def open_run(
    journey: str,
    profile: Any,
    config: Any,
    *,
    log_path: str = "",
    run_name: str = "",
    if_exists: str = "resume",
    steps: int | None = None,
) -> Run:
    """Open ``runs/<journey>/<run_name or profile name>`` (or ``log_path``) as ``if_exists`` says.

    ``profile`` has ``name``, ``config_hash`` and ``raw``; ``config`` is the journey's chz
    config, recorded in ``config.json``. The returned run's ``finished`` holds the stored
    summary when a finished run is resumed (nothing left to do), and ``resume`` the newest
    checkpoint state when an unfinished one is. ``steps`` (the command line's, None for the
    profile's) larger than a finished run's continues it from its newest resumable checkpoint.
    """
    if if_exists not in IF_EXISTS:
        raise CheckpointError(f"if_exists={if_exists!r}; accepted: {', '.join(IF_EXISTS)}")
    path = run_path(journey, profile, log_path, run_name)
    checkpoints = RunCheckpoints(path / "checkpoints")
    existing = [name for name in _RECORDS if (path / name).exists()] + (
        [f"checkpoints up to step {checkpoints.steps()[-1]}"] if checkpoints.steps() else []
    )
    if existing and if_exists == "fail":
        raise CheckpointError(
            f"{path} already holds a run ({', '.join(existing)}); pass if_exists=resume to "
            "continue it, if_exists=overwrite to start again, or another run_name"
        )
    if existing and if_exists == "overwrite":
        log.info("if_exists=overwrite: removing the run in %s", path)
        for name in (*_RECORDS, *_LOGS):
            (path / name).unlink(missing_ok=True)
        checkpoints.clear()
        shutil.rmtree(path / "backend", ignore_errors=True)
    recorded = _recorded_hash(path)
    latest = checkpoints.latest()
    for source, value in (("checkpoints/step_N", latest and latest.get("config_hash")),
                          ("config.json", recorded)):  # fmt: skip
        if value is not None and value != profile.config_hash:
            raise CheckpointError(
                f"{path}/{source}: written with profile hash {value}, this run's profile "
                f"hashes to {profile.config_hash}; resume with the same profile, pass "
                "if_exists=overwrite or another run_name"
            )
    path.mkdir(parents=True, exist_ok=True)
    global _LAST_OPENED
    _LAST_OPENED = path
    run = Run(path, config_hash=profile.config_hash, resume=latest, journey=journey)
    summary_path = path / "summary.json"
    last_step = max((m.get("step", 0) for m in run.read_metrics()), default=0)
    if summary_path.exists() and (latest is None or latest["step"] < last_step):
        # Finished, and its newest checkpoint (if any) is not its end: nothing to resume,
        # unless more steps are asked for than it trained (then from that checkpoint).
        if steps is None or steps <= last_step:
            run.finished = json.loads(summary_path.read_text())
            log.info("%s is a finished run of %d steps; returning its summary (if_exists=resume)",
                     path, last_step)  # fmt: skip
            return run
        if latest is None:
            raise CheckpointError(
                f"{path} is a finished run of {last_step} steps with no resumable checkpoint, "
                f"so steps={steps} cannot continue it; pass if_exists=overwrite (or another "
                f"run_name) to train {steps} steps from the start, and a checkpoint interval "
                "(ckpt_interval= or the profile's ckpt.interval) to make a run extendable"
            )
        log.info("%s finished at step %d; steps=%d continues it from its checkpoint at step %d "
                 "(steps after it are trained again)", path, last_step, steps, latest["step"])  # fmt: skip
    if latest is None and last_step:
        raise CheckpointError(
            f"{path} holds an unfinished run (metrics up to step {last_step}) with no "
            "checkpoint to resume from; pass if_exists=overwrite to start it again, or "
            "another run_name"
        )
    run.reload_resume()
    write_json_atomic(
        path / "config.json",
        {
            "journey": journey,
            "config": chz.asdict(config) if chz.is_chz(config) else config,
            "profile": profile.raw,
            "config_hash": profile.config_hash,
            "git_revision": git_revision(),
            "resumed_from_step": run.resumed_from_step,
        },
    )
    run.trackers = open_trackers(
        tensorboard_dir=getattr(config, "tensorboard_dir", ""),
        wandb_project=getattr(config, "wandb_project", ""),
        run_dir=path,
        config={"journey": journey, "profile": profile.raw, "config_hash": profile.config_hash},
    )
    return run


def _recorded_hash(path: Path) -> str | None:
    try:
        return json.loads((path / "config.json").read_text()).get("config_hash")
    except (OSError, ValueError):
        return None


# -- a journey's command line -----------------------------------------------------------------


def user_errors() -> tuple[type[BaseException], ...]:
    """What a person's command, profile, overrides, connection file or environment can get
    wrong, and a local backend that died: reported as one message, never as a traceback."""
    from cortex_recipes.endpoint import BackendDied, ConnectionConfigError, EndpointUnreachable
    from cortex_recipes.models import ModelNotAvailableError
    from cortex_recipes.primerl.launch import PrimeRLNotFound
    from cortex_recipes.weights import WeightsError

    return (
        profiles.ProfileError, ConnectionConfigError, CheckpointError, PrimeRLNotFound,
        ModelNotAvailableError, WeightsError, BackendDied, EndpointUnreachable,
    )  # fmt: skip


def command_line(config_cls: type, profile_cls: type, main: Any, report: Any = None) -> int:
    """A journey's ``__main__``: :func:`entrypoint`, ``main(config)``, then ``report(result)``
    printed. A user error (:func:`user_errors`) is one ``error: ...`` line on stderr and exit
    code 2; its traceback goes to the run's ``debug.log`` when the run folder was opened, else
    to a file named on that line. Anything else is a bug and keeps its traceback."""
    try:
        result = main(profiles.entrypoint(config_cls, profile_cls))
    except user_errors() as exc:
        opened = last_opened()
        log_path = opened / "debug.log" if opened else None
        try:
            if log_path is None:
                handle, name = tempfile.mkstemp(prefix="cortex-recipes-error-", suffix=".log")
                os.close(handle)
                log_path = Path(name)
            with open(log_path, "a") as out:
                traceback.print_exception(exc, file=out)
            where = f" (details: {log_path})"
        except OSError:
            where = ""
        print(f"error: {exc}{where}", file=sys.stderr)
        return 2
    except Exception as exc:  # noqa: BLE001 - only a full disk is reported here, else re-raised
        if not is_disk_full(exc):
            raise
        opened = last_opened()
        kept = ""
        if opened is not None:
            steps = RunCheckpoints(opened / "checkpoints").steps()
            done = max((json.loads(x).get("step", 0) for x in _lines(opened / "metrics.jsonl")),
                       default=0)  # fmt: skip
            kept = (
                f"; kept in {opened}: records of steps 1-{done}, resume points "
                f"{steps or 'none'}: free space and rerun the same command to resume"
            )
        print(f"error: {exc}{kept}", file=sys.stderr)
        return 2
    if report is not None:
        print(report(result))
    return 0


def _lines(path: Path) -> list[str]:
    try:
        return [line for line in path.read_text().splitlines() if line.strip()]
    except OSError:
        return []
