"""The async GRPO journey's loop on prime-rl's own orchestrator: configs, processes, metrics.

``run_primerl`` takes an open run, a connected client and a GRPO profile and runs, until
``max_steps`` is published:

- one Cortex job (training + sampling sub-jobs, from the profile);
- the inference adapter (``primerl.inference``) on 127.0.0.1, which prime-rl uses as its vLLM
  server;
- the trainer adapter (``primerl.trainer``) in a thread of this process;
- prime-rl's ``env-server`` and ``orchestrator``, unchanged, in prime-rl's own environment
  (``primerl.launch``), from an ``orch.toml`` and ``env.toml`` written into the run directory;
  they die with this process, even on its SIGKILL (``primerl/exit_with_parent.py``).

The task is the offline ``cortex-arith`` verifiers taskset (``primerl/tasksets/`` beside this
file), generated with the profile's ``env`` knobs. Lag bounds are prime-rl's own:
``max_off_policy_steps`` from the profile, and prime-rl's fixed async level of one step
(batch ``n`` ships once version ``n - 2`` is published).

Per step the journey's ``metrics.jsonl`` gets the trainer adapter's record (loss, reward
statistics from the advantages prime-rl computed, ``time/*``) merged with prime-rl's own
record for that step (its ``metrics.jsonl``: off-policy lag, in-flight counts, rewards), under
the key prefix ``primerl/``; the merged record is checked against ``async_grpo/prime-rl`` in
metrics_schema.json (docs/metrics.md), where ``primerl/*`` is the one open namespace. Records
are written as steps are published, and on the steps where prime-rl's orchestrator checkpoints
(the profile's ``ckpt.interval``) the run gets a resume point: rerunning the same command after
a kill resumes both sides from the newest one (:mod:`cortex_recipes.primerl.resume`).
"""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cortex_recipes import frames
from cortex_recipes.models import load_tokenizer, resolve_model_path
from cortex_recipes.primerl import broadcasts, resume, step_records
from cortex_recipes.primerl.inference import InferenceAdapter
from cortex_recipes.primerl.launch import child_command, primerl_python
from cortex_recipes.primerl.trainer import METRICS, TrainerAdapter, TrainerAdapterConfig
from cortex_recipes.reconnect import is_recoverable
from cortex_recipes.run import CheckpointError
from cortex_recipes.tito.gateway import Gateway

log = logging.getLogger(__name__)

METRICS_SCHEMA = "async_grpo/prime-rl"  # this runner's record in metrics_schema.json


def tasksets_dir() -> Path:
    """The journey's taskset folder (beside this file: the checkout, or ``/app`` in an image)."""
    return Path(__file__).resolve().parent / "primerl" / "tasksets"


# The taskset's own in-process chat harness (tasksets/cortex_arith): verifiers' ``null`` harness
# starts a program per rollout, which bounded the CPU profile at about 30 rollouts a minute.
HARNESS = "cortex-arith"
API_KEY_VAR = "CORTEX_PRIMERL_ADAPTER_KEY"  # prime-rl's client reads a key from a variable
# The renderer prime-rl uses per model family; anything else renders with the tokenizer's own
# chat template (renderers' "default").
RENDERERS = {"qwen3": "qwen3"}


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a TOML basic string is a JSON string for these values
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    raise TypeError(f"cannot write {value!r} to TOML")


def _table(name: str, values: dict[str, Any], array: bool = False) -> str:
    head = f"[[{name}]]" if array else f"[{name}]"
    return "\n".join([head, *(f"{k} = {_toml(v)}" for k, v in values.items())]) + "\n"


TASKS_FILE = "tasks.jsonl"


def check_dataset(profile) -> None:
    """The prime-rl taskset scores the first integer of the reply against an integer answer:
    reasoning-gym's ``basic_arithmetic``, or a task file (``env.tasks``, integer answers)."""
    if profile.env.tasks is None and profile.env.dataset != "basic_arithmetic":
        raise ValueError(
            f"env.dataset={profile.env.dataset!r}: the prime-rl path's taskset scores integer "
            "answers ('basic_arithmetic', or a task file in env.tasks)"
        )


def write_tasks(profile, path: Path) -> Path:
    """The profile's training problems for the ``cortex-arith`` taskset, one
    ``{"prompt", "answer", "partial_credit"}`` per line: the same reasoning-gym problems and prompts (question plus the
    profile's instruction) Math GRPO and the greedy eval use, so prime-rl trains on the
    distribution the eval measures. Written atomically.

    The lines follow Math GRPO's seeded task order (``rl.grpo.task_order`` of ``env.seed``):
    prime-rl's buffer takes a taskset's tasks in file order, so step ``N`` trains on the same
    problems as step ``N`` of the synchronous example, and the two compare step for step."""
    from cortex_recipes.envs.math import MathEnv
    from cortex_recipes.rl.grpo import task_order

    check_dataset(profile)
    env, _ = profile.envs()
    # Math GRPO trains on env.score: reasoning-gym's partial credit for its problems (unless
    # the profile's env.reward is exact), exact answers only for a task file. The taskset
    # applies the same rule per line.
    partial = isinstance(env, MathEnv) and not env.exact
    lines = []
    for index in task_order(profile.env.seed, env.size):
        task = env.task(index)
        row = {"prompt": env.prompt(task), "answer": task.answer, "partial_credit": partial}
        lines.append(json.dumps(row))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text("\n".join(lines) + "\n")
    tmp.rename(path)
    return path


def taskset_settings(profile, tasks_path: Path) -> dict[str, Any]:
    """The ``cortex-arith`` taskset's settings: the problems file :func:`write_tasks` wrote and
    ``env.latency_s``, what every rollout waits on its environment before it is scored."""
    check_dataset(profile)
    settings: dict[str, Any] = {"id": "cortex-arith", "tasks_path": str(tasks_path)}
    if profile.env.latency_s:
        settings["latency_s"] = float(profile.env.latency_s)
    return settings


def renderer_name(model: str) -> str:
    name = str(model).lower()
    return next((r for key, r in RENDERERS.items() if key in name), "default")


def concurrency(profile) -> dict[str, int]:
    """Fixed in-flight episodes: the profile's ``max_inflight_groups`` groups (prime-rl's
    adaptive controller otherwise starts at one episode and sizes itself from vLLM's KV-cache
    metrics, which this backend does not publish)."""
    groups = profile.orchestrator.max_inflight_groups or 1
    episodes = groups * profile.orchestrator.group_size
    return {"initial_inflight": episodes, "min_inflight": episodes, "max_inflight": episodes}


def ckpt_interval(profile) -> int:
    """The profile's ``ckpt.interval`` (1 when it has none): how often prime-rl's orchestrator
    checkpoints, and so how often the run gets a point both sides can resume from."""
    return profile.ckpt.interval if profile.ckpt else 1


def orchestrator_toml(profile, *, model_dir: Path, base_url: str, output_dir: Path, port: int,
                      max_steps: int, tasks_path: Path,
                      resume_step: int | None = None) -> str:  # fmt: skip
    """prime-rl's ``orch.toml``; ``resume_step`` (>= 1) resumes its orchestrator from that
    step's checkpoint (``[resume] step``: the batch after it ships next)."""
    orch = profile.orchestrator
    sampling = orch.sampling
    top = {
        "output_dir": str(output_dir),
        "max_steps": max_steps,
        "seq_len": profile.max_seq_len,
        "batch_size": orch.batch_size,
        "group_size": orch.group_size,
        "max_off_policy_steps": 1
        if orch.max_off_policy_steps is None
        else orch.max_off_policy_steps,
        "env_server_base_port": port,
        "collect_inference_metrics": False,
    }
    resume = [_table("resume", {"step": resume_step})] if resume_step else []
    return "\n".join(
        [
            "".join(f"{k} = {_toml(v)}\n" for k, v in top.items()),
            _table("ckpt", {"interval": ckpt_interval(profile)}),
            *resume,
            _table("concurrency", concurrency(profile)),
            _table("model", {"name": str(model_dir)}),
            _table("model.client", {"base_url": base_url, "api_key_var": API_KEY_VAR}),
            _table("renderer", {"name": renderer_name(profile.model)}),
            _table("rollout_transport", {"type": "filesystem"}),
            _table("weight_broadcast", {"type": "filesystem"}),
            # Ship every sample, zero-advantage groups included: a step always trains
            # batch_size samples (a small or random model on CPU often scores a whole group
            # alike, and prime-rl's default filter would then never ship a batch).
            _table("train", {"filter_zero_advantages": False}),
            _table(
                "train.sampling",
                {
                    "max_completion_tokens": sampling.max_tokens,
                    "temperature": sampling.temperature,
                },
            ),
            _table("train.source", {"name": "cortex-arith", "group_size": orch.group_size}, True),
            _table("train.source.env.taskset", taskset_settings(profile, tasks_path)),
            _table("train.source.env.agent.harness", {"id": HARNESS}),
            _table("train.source.env.agent.runtime", {"type": "subprocess"}),
            _table("train.source.serve", {"address": f"tcp://127.0.0.1:{port}"}),
        ]
    )


def env_server_toml(profile, *, output_dir: Path, port: int, tasks_path: Path) -> str:
    return "\n".join(
        [
            f"output_dir = {_toml(str(output_dir))}\n",
            _table("env.taskset", taskset_settings(profile, tasks_path)),
            _table("env.agent.harness", {"id": HARNESS}),
            _table("env.agent.runtime", {"type": "subprocess"}),
            _table("serve", {"address": f"tcp://127.0.0.1:{port}"}),
        ]
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def merge_record(ours: dict[str, Any], theirs: dict[str, Any] | None) -> dict[str, Any]:
    """The trainer adapter's record of a step with prime-rl's, under ``primerl/``."""
    extra = {f"primerl/{k}": v for k, v in (theirs or {}).items() if k != "step"}
    return {**ours, **extra}


def merged_metrics(output_dir: Path) -> list[dict[str, Any]]:
    """The trainer adapter's per-step records, each with prime-rl's record for that step."""
    theirs = {r["step"]: r for r in _jsonl(output_dir / "metrics.jsonl") if "step" in r}
    return [merge_record(r, theirs.get(r["step"])) for r in _jsonl(output_dir / "cortex" / METRICS)]


def overlap_fraction(training: list[tuple[float, float]],
                     generation: list[tuple[float, float]]) -> float:  # fmt: skip
    """The share of training time during which at least one rollout was being generated."""
    merged: list[list[float]] = []
    for start, end in sorted(generation):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    total = sum(end - start for start, end in training)
    both = sum(
        max(0.0, min(end, g_end) - max(start, g_start))
        for start, end in training
        for g_start, g_end in merged
    )
    return both / total if total > 0 else 0.0


REWARD_KEY = re.compile(r"^primerl/train/agg/effective/[^/]+/reward/mean$")


def step_reward(record: dict[str, Any]) -> float | None:
    """The mean reward of the samples a step trained on, from prime-rl's record (its
    ``train/agg/effective/<agent>/reward/mean``); None when prime-rl logged none."""
    found = [v for k, v in record.items() if REWARD_KEY.match(k)]
    if len(found) > 1:
        keys = sorted(k for k in record if REWARD_KEY.match(k))
        raise ValueError(f"step {record.get('step')}: more than one agent's reward: {keys}")
    return found[0] if found else None


def primerl_record(output_dir: Path, step: int) -> dict[str, Any] | None:
    """prime-rl's own record of ``step`` (its ``metrics.jsonl``; the last one when repeated)."""
    found = [r for r in _jsonl(output_dir / "metrics.jsonl") if r.get("step") == step]
    return found[-1] if found else None


def shared_keys(merged: dict[str, Any]) -> dict[str, Any]:
    """The metrics every GRPO runner spells the same (docs/metrics.md), from prime-rl's keys:
    ``reward/mean`` (the trained samples' reward, :func:`step_reward`), ``off_policy/mean`` and
    ``off_policy/max`` (prime-rl's observed lag; an integer count of steps)."""
    out: dict[str, Any] = {}
    reward = step_reward(merged)
    if reward is not None:
        out["reward/mean"] = reward
    mean, top = merged.get("primerl/off_policy/mean"), merged.get("primerl/off_policy/max")
    if mean is not None:
        out["off_policy/mean"] = mean
    if top is not None:
        if float(top) != int(top):
            raise ValueError(f"step {merged.get('step')}: primerl/off_policy/max={top!r}; a count")
        out["off_policy/max"] = int(top)
    return out


class RunRecorder:
    """The trainer adapter's ``on_step``: each published step's record, merged with prime-rl's
    record of that step and the shared keys (:func:`shared_keys`), goes to the run's
    ``metrics.jsonl``; then, on the steps where prime-rl's orchestrator checkpoints, the run's
    own resume point (:mod:`cortex_recipes.primerl.resume`). ``evaluate_last`` (returns an
    accuracy) runs before the last step's record is written, which then carries
    ``eval/accuracy`` as Math GRPO's last record does."""

    def __init__(self, run, output_dir: Path, *, interval: int, max_steps: int,
                 state: dict[str, Any], wait_s: float = 30.0,
                 evaluate_last: Callable[[], float] | None = None):  # fmt: skip
        self.run, self.output_dir = run, Path(output_dir)
        self.interval, self.max_steps = interval, max_steps
        self.state = state  # what every resume point carries besides the step and trainer
        self.wait_s = wait_s
        self.evaluate_last = evaluate_last
        # Set once prime-rl's orchestrator runs: a dead one writes nothing more, so waiting
        # for its files stops at once (one last look, its files are written before it exits).
        self.alive: Callable[[], bool] | None = None

    def _wait(self, predicate) -> bool:
        deadline = time.monotonic() + self.wait_s
        while not predicate():
            if time.monotonic() > deadline or (self.alive is not None and not self.alive()):
                return predicate()
            time.sleep(0.1)
        return True

    def save_point(self, step: int) -> bool:
        """The run's resume point at ``step``, if both sides can resume from it."""
        if not resume.agreed(self.output_dir, step):
            return False
        manifest = broadcasts.read_manifest(broadcasts.version_dir(self.output_dir, step))
        trainer = {k: manifest.get(k) for k in ("job_id", "checkpoint_id", "stage_path")}
        self.run.checkpoints.save(
            step,
            {**self.state, "runner": RUNNER, "config_hash": self.run.config_hash,
             "trainer": trainer},
        )  # fmt: skip
        self.run.checkpoint(step=step, checkpoint_type="resumable", runner=RUNNER, **trainer)
        return True

    def __call__(self, record: dict[str, Any]) -> None:
        step = record["step"]
        self._wait(lambda: primerl_record(self.output_dir, step) is not None)
        theirs = primerl_record(self.output_dir, step)
        if theirs is None:  # killed between its checkpoint and its metrics line
            theirs = step_records.recover(self.output_dir, step)
            log.warning("step %d: prime-rl wrote no record; %s", step,
                        theirs.get("record_lost_because") or theirs[step_records.SOURCE_KEY])  # fmt: skip
        merged = merge_record(record, theirs)
        merged.update(shared_keys(merged))
        if step == self.max_steps and self.evaluate_last is not None:
            merged["eval/accuracy"] = self.evaluate_last()
        self.run.record_metrics(merged, schema=METRICS_SCHEMA)
        if step % self.interval == 0 or step == self.max_steps:
            ckpt = resume.orchestrator_checkpoint(self.output_dir, step)
            if not (self._wait(ckpt.is_file) and self.save_point(step)):
                log.warning("step %d: no orchestrator checkpoint %s; no resume point", step, ckpt)


RUNNER = "prime-rl"
SOURCE = f"primerl/{step_records.SOURCE_KEY}"


def run_primerl(client, profile, run, *, max_steps: int, job_id: str,
                state: dict[str, Any] | None = None, python: str | None = None,
                timeout_s: float = 3600.0,
                evaluate_last: Callable[[], float] | None = None) -> dict[str, Any]:  # fmt: skip
    """Train up to ``max_steps`` with prime-rl's orchestrator; returns the summary fields.

    ``run.resume`` (a resume point this function wrote) makes it resume after that step;
    ``state`` is carried in every resume point (the journey's eval history);
    ``evaluate_last`` is :class:`RunRecorder`'s.
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
                               timeout_s=timeout_s, evaluate_last=evaluate_last)  # fmt: skip
    records = run.read_metrics()
    steps = [r["step"] for r in records]
    if steps != list(range(1, max_steps + 1)):
        raise RuntimeError(
            f"{run.path}/metrics.jsonl holds steps {steps}, expected 1..{max_steps} once each"
        )
    return {
        "orchestrator": RUNNER,
        "published_versions": broadcasts.published_versions(output_dir),
        "steps": steps,
        "losses": [r.get("loss") for r in records],
        "rewards": [step_reward(r) for r in records],
        "off_policy_max_per_step": [r.get("primerl/off_policy/max") for r in records],
        # shipped episodes per lag over the whole run, and those prime-rl cancelled as stale
        "lag_histogram": step_records.lag_counts(output_dir, range(1, max_steps + 1)),
        "stale_cancelled": step_records.stale_cancellations(work / "orchestrator.log"),
        # Steps whose prime-rl record was re-derived from its episodes, or lost (step_records).
        "primerl_record_sources": {
            str(r["step"]): r[SOURCE] for r in records if r.get(SOURCE) is not None
        },
        "applied_versions": [
            v
            for v in broadcasts.published_versions(output_dir)
            if broadcasts.is_applied(output_dir, v)
        ],
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
           timeout_s: float,
           evaluate_last: Callable[[], float] | None = None) -> tuple[dict[str, int], float]:  # fmt: skip
    model_dir = resolve_model_path(profile.model)
    tokenizer = load_tokenizer(profile.model)
    pad_id = frames.pad_id(tokenizer)
    port = free_port()
    interval = ckpt_interval(profile)
    recorder = RunRecorder(run, output_dir, interval=interval, max_steps=max_steps, state=state,
                           evaluate_last=evaluate_last)  # fmt: skip
    adapter, trainer = adapters(
        client, job_id, profile, output_dir, max_steps=max_steps, pad_id=pad_id,
        learning_rate=profile.learning_rate, on_step=recorder,
    )  # fmt: skip
    # Before prime-rl starts: the version it syncs first must be live in this job already.
    version = trainer.start()
    if version != (resume_step or 0):
        raise CheckpointError(
            f"{output_dir}/broadcasts: the trainer adapter resumed at version {version}, the "
            f"run's resume point is step {resume_step or 0}"
        )
    if resume_step is None and not recorder.save_point(0):
        raise RuntimeError(f"{output_dir}: version 0 was not published")
    if version >= max_steps:  # killed after its last resume point: the weights are loaded
        return dict(adapter.counters), 0.0
    failures: list[BaseException] = []

    def train() -> None:
        try:
            trainer.train_steps()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller below
            failures.append(exc)

    env = {**os.environ, API_KEY_VAR: "local", "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": str(tasksets_dir())}  # fmt: skip
    tasks_path = write_tasks(profile, work / TASKS_FILE)
    with Gateway(adapter.app) as gateway:
        (work / "orch.toml").write_text(
            orchestrator_toml(
                profile,
                model_dir=model_dir,
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
        thread = threading.Thread(target=train, name="trainer-adapter", daemon=True)
        thread.start()
        with (
            open(work / "env-server.log", "ab") as env_log,
            open(work / "orchestrator.log", "ab") as orch_log,
        ):
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
