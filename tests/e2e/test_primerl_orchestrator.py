"""prime-rl's real orchestrator and env-server against the two adapters on the local backend.

Runs only where a prime-rl environment exists (prime-rl 559b447 + verifiers a60a606, Python
3.12; see docs/async-grpo.md): set ``CORTEX_RECIPES_PRIMERL_PYTHON`` to that environment's
python. Its ``orchestrator`` and ``env-server`` scripts sit beside it. The taskset is the
offline ``cortex-echo`` in tests/e2e/primerl_env/; the harness is the journey's own in-process
chat harness (``cortex-arith``), which runs no program per rollout. verifiers' ``null`` harness
would build a uv script environment at run time from whatever openai and httpx PyPI serves that
day, so the test would depend on the day it runs.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
from pathlib import Path

import pytest

from tests import extras

pytest.importorskip("msgspec", reason=extras.reason("grpo"))

from cortex_recipes.gateway import Gateway
from cortex_recipes.models import resolve_model_path
from cortex_recipes.primerl import broadcasts, step_records
from cortex_recipes.primerl.configs import HARNESS as harness
from cortex_recipes.primerl.inference import InferenceAdapter
from cortex_recipes.primerl.launch import ENV_VAR, script_command
from cortex_recipes.primerl.trainer import TrainerAdapter, TrainerAdapterConfig
from recipes.rl.async_grpo.loop import tasksets_dir
from tests.e2e.conftest import TINY, inference, start, training

PRIMERL_PYTHON = os.environ.get(ENV_VAR)
ENV_DIR = Path(__file__).resolve().parent / "primerl_env"
STEPS = 3

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(
        not PRIMERL_PYTHON,
        reason="no prime-rl environment: set CORTEX_RECIPES_PRIMERL_PYTHON to its python",
    ),
]


def orchestrator_toml(model_dir: Path, base_url: str, output_dir: Path, port: int) -> str:
    return f"""
output_dir = "{output_dir}"
max_steps = {STEPS}
seq_len = 256
batch_size = 4
group_size = 2
env_server_base_port = {port}
collect_inference_metrics = false

[model]
name = "{model_dir}"

[model.client]
base_url = "{base_url}"
api_key_var = "CORTEX_PRIMERL_ADAPTER_KEY"

[renderer]
name = "qwen3"

[rollout_transport]
type = "filesystem"

[weight_broadcast]
type = "filesystem"

[train]
# A random-init tiny model never earns the echo reward, so every group has zero advantage;
# prime-rl drops those by default and would never ship a batch. Keep them: this test checks
# the protocol, not learning.
filter_zero_advantages = false

[train.sampling]
max_completion_tokens = 8

[[train.source]]
name = "cortex-echo"
group_size = 2

[train.source.env.taskset]
id = "cortex-echo"

[train.source.env.agent.harness]
id = "{harness}"

[train.source.env.agent.runtime]
type = "subprocess"

[train.source.serve]
address = "tcp://127.0.0.1:{port}"
"""


def env_server_toml(output_dir: Path, port: int) -> str:
    return f"""
output_dir = "{output_dir}"

[env.taskset]
id = "cortex-echo"

[env.agent.harness]
id = "{harness}"

[env.agent.runtime]
type = "subprocess"

[serve]
address = "tcp://127.0.0.1:{port}"
"""


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_prime_rl_orchestrator_trains_through_the_adapters(client, tmp_path):
    python = Path(PRIMERL_PYTHON)
    job = start(client, [training(lr=1e-3), inference()])
    out = tmp_path / "outputs"
    port = free_port()
    adapter = InferenceAdapter(client, job, model=str(resolve_model_path(TINY)),
                               max_model_len=256, output_dir=out)  # fmt: skip
    trainer = TrainerAdapter(
        client,
        TrainerAdapterConfig(
            output_dir=out,
            job_id=job,
            max_steps=STEPS,
            pad_id=0,
            poll_s=0.1,
            batch_timeout_s=600,
        ),
    )
    failures: list[str] = []

    def train():
        try:
            trainer.run()
        except BaseException as exc:  # noqa: BLE001 - reported below
            failures.append(repr(exc))

    env = {**os.environ, "CORTEX_PRIMERL_ADAPTER_KEY": "local", "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": os.pathsep.join([str(ENV_DIR), str(tasksets_dir())])}  # fmt: skip
    with Gateway(adapter.app) as gateway:
        (tmp_path / "orch.toml").write_text(
            orchestrator_toml(resolve_model_path(TINY), gateway.base_url, out, port)
        )
        (tmp_path / "env.toml").write_text(env_server_toml(tmp_path / "env-out", port))
        # A daemon, so a failed orchestrator cannot leave pytest waiting on it.
        thread = threading.Thread(target=train, name="trainer-adapter", daemon=True)
        thread.start()
        env_log = open(tmp_path / "env-server.log", "w")  # noqa: SIM115 - closed below
        env_server = subprocess.Popen(
            script_command(python, "env-server", "@", str(tmp_path / "env.toml")),
            env=env, stdout=env_log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        try:
            orchestrator = subprocess.run(
                script_command(python, "orchestrator", "@", str(tmp_path / "orch.toml")),
                env=env, capture_output=True, text=True, timeout=900,
            )  # fmt: skip
        finally:
            env_server.terminate()
            env_server.wait(timeout=30)
            env_log.close()
        thread.join(timeout=300)
    client.cancel_job(job)
    (tmp_path / "orchestrator.log").write_text(orchestrator.stdout + orchestrator.stderr)
    assert orchestrator.returncode == 0, orchestrator.stderr[-4000:]
    assert not failures, failures
    assert broadcasts.published_versions(out) == list(range(STEPS + 1))
    assert all((out / "rollouts" / f"step_{s}" / "rank_0.bin").is_file() for s in (1, 2, 3))
    records = [
        json.loads(x) for x in (out / "cortex" / "trainer_metrics.jsonl").read_text().splitlines()
    ]
    assert [r["step"] for r in records] == [1, 2, 3]
    # The shaped echo reward differs within groups, so the steps really trained.
    assert any(r["grad_norm"] and r["grad_norm"] > 0 for r in records), records
    assert all(r["samples"] == 4 and r["trainable_tokens"] > 0 for r in records), records
    # Every step's record re-derived from its shipped episodes equals prime-rl's own line.
    lines = (out / "metrics.jsonl").read_text().splitlines()
    theirs = {r["step"]: r for r in map(json.loads, lines)}
    for step in range(1, STEPS + 1):
        derived = step_records.rederive(out, step)
        for key, value in derived.items():
            if key != step_records.SOURCE_KEY:
                assert theirs[step][key] == pytest.approx(value), (step, key)
    record_dir = os.environ.get("CORTEX_RECIPES_PRIMERL_RECORD")
    if record_dir:  # how primerl/recorded was produced (its README)
        record_out = Path(record_dir).parent
        for step in range(1, STEPS + 1):
            for name in ("rank_0.bin", "train/effective/traces.jsonl"):
                target = Path(record_dir) / f"step_{step}" / name
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(out / "rollouts" / f"step_{step}" / name, target)
        shutil.copyfile(out / "metrics.jsonl", record_out / "metrics.jsonl")
    assert adapter.counters["generate_requests"] >= STEPS * 4
    assert adapter.counters["weight_updates"] >= 1
