"""prime-rl's configuration for the async GRPO journey, from a GRPO profile: the orchestrator's
``orch.toml``, the env-server's ``env.toml`` and the ``cortex-arith`` taskset's problems file.

The taskset itself (``recipes/rl/async_grpo/primerl/tasksets/``) runs inside prime-rl's
environment; the journey's loop (``recipes/rl/async_grpo/loop.py``) writes these files into
the run directory and starts prime-rl's processes on them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

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
