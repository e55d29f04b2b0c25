"""The async GRPO journey's smoke: prime-rl's orchestrator where it is installed, else its two
adapters replaying rollout files that prime-rl wrote.

    python -m recipes.rl.async_grpo.smoke

With ``$CORTEX_RECIPES_PRIMERL_PYTHON`` set (a prime-rl environment, docs/async-grpo.md) this is
the journey itself on the tiny smoke profile: ``recipes.rl.async_grpo.train`` with
``profile=configs/local-cpu-tiny-qwen3-smoke.json``.

Without it (CI, and a journey image built without prime-rl's sources, which need GitHub) the
orchestrator cannot run, and the smoke says so on stderr and in its JSON line
(``"orchestrator": "not run: ..."``). It then checks the half of the journey this project owns,
on the same local backend and model: the trainer adapter trains on the three
``rank_0.bin`` files in ``primerl/recorded/`` (written by prime-rl 559b447's orchestrator in a
real run; their README says how) and publishes each version; after each step the inference
adapter is synced to exactly that version through prime-rl's weight-update calls (pause,
``NCCL_READY``, ``/update_weights``, resume) and serves a greedy ``/inference/v1/generate``
with that version's weights. It fails (exit 1) when a step does not train, a version is not
published or applied, or the sampler's answer does not change after training with a high
learning rate.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
from pathlib import Path

import chz
import requests

from cortex_recipes import frames, profiles
from cortex_recipes.models import load_tokenizer, resolve_model_path
from cortex_recipes.primerl.launch import ENV_VAR
from cortex_recipes.rl.grpo_profile import GRPOProfile, load_grpo_profile
from cortex_recipes.run import RunConfig, open_run, profile_field
from cortex_recipes.training_job import Trainer

log = logging.getLogger("recipes.rl.async_grpo.smoke")
HERE = Path(__file__).parent
SMOKE_PROFILE = "recipes/rl/async_grpo/configs/local-cpu-tiny-qwen3-smoke.json"
RECORDED = HERE / "primerl" / "recorded" / "rollouts"
# A fixed chat prompt in the tiny model's (Qwen) vocabulary: what the sampler's weights say.
PROBE = [151644, 872, 198, 13048, 151645, 198, 151644, 77091, 198]
NOT_RUN = (
    f"not run: no prime-rl environment (${ENV_VAR} is not set). The adapters replayed rollout "
    "files prime-rl 559b447 wrote; install prime-rl to smoke its orchestrator "
    "(docs/async-grpo.md, 'Installing prime-rl')"
)


@chz.chz
class Config(RunConfig):
    profile: str = profile_field(SMOKE_PROFILE)
    replay_learning_rate: float = chz.field(
        default=5e-2, doc="adapters-only replay: a rate high enough that one step moves the probe"
    )


RUN_FIELDS = (
    "profile", "connection", "run_name", "log_path", "if_exists", "overrides", "progress",
    "tensorboard_dir", "wandb_project",
)  # fmt: skip


class SmokeFailed(RuntimeError):
    """The replay did not show what it checks; the message says which step and what."""


def probe(base: str, model: str) -> list[int]:
    body = {
        "model": model,
        "token_ids": PROBE,
        "sampling_params": {"temperature": 0.0, "max_tokens": 6, "seed": 0, "logprobs": 1,
                            "return_token_ids": True},
    }  # fmt: skip
    response = requests.post(f"{base}/inference/v1/generate", json=body, timeout=300)
    response.raise_for_status()
    return response.json()["choices"][0]["token_ids"]


def sync(base: str, output_dir: Path, version: int) -> dict:
    """prime-rl's weight update: pause, NCCL_READY, update_weights, resume (in a finally)."""
    from cortex_recipes.primerl import broadcasts

    weight_dir = broadcasts.version_dir(output_dir, version)
    requests.post(f"{base}/pause", params={"mode": "keep"}, timeout=60).raise_for_status()
    try:
        (weight_dir / "NCCL_READY").touch()
        response = requests.post(
            f"{base}/update_weights", json={"weight_dir": str(weight_dir)}, timeout=600
        )
        response.raise_for_status()
        return response.json()
    finally:
        requests.post(f"{base}/resume", timeout=60).raise_for_status()


def replay(config: Config, profile: GRPOProfile) -> dict:
    from cortex_recipes.gateway import Gateway
    from cortex_recipes.primerl import broadcasts
    from recipes.rl.async_grpo.loop import adapters

    steps = sorted(int(p.parent.name.removeprefix("step_")) for p in RECORDED.glob("*/rank_0.bin"))
    if steps != list(range(1, len(steps) + 1)) or not steps:
        raise SmokeFailed(f"{RECORDED}: expected step_1..step_N/rank_0.bin, found steps {steps}")
    run = open_run(
        "async_grpo", profile, config, log_path=config.log_path,
        run_name=config.run_name or "adapters-replay", if_exists="overwrite",
    )  # fmt: skip
    output_dir = run.path / "primerl" / "outputs"
    shutil.copytree(RECORDED, output_dir / "rollouts")
    model_dir = resolve_model_path(profile.model)
    tokenizer = load_tokenizer(profile.model)
    records, probes, synced = [], [], []
    with run.connect(config.connection, client_options={"poll_timeout": 1800.0}) as client:
        trainer_job = Trainer.start(
            client, profile.sub_jobs(), run, weight_format=profile.weight_format
        )
        job_id = trainer_job.job_id
        adapter, trainer = adapters(
            client, job_id, profile, output_dir, max_steps=len(steps),
            pad_id=frames.pad_id(tokenizer), learning_rate=config.replay_learning_rate,
            poll_s=0.05,
        )  # fmt: skip
        with Gateway(adapter.app) as gateway:
            base = gateway.base_url.removesuffix("/v1")
            if trainer.start() != 0:
                raise SmokeFailed(f"{output_dir}/broadcasts: a fresh run must start at version 0")
            probes.append(probe(base, str(model_dir)))
            for step in steps:
                record = trainer.train_step(step)
                if not record["trainable_tokens"] or record["loss"] is None:
                    raise SmokeFailed(f"step {step}: nothing trained ({record})")
                records.append(record)
                answer = sync(base, output_dir, step)
                if answer != {"version": step, "synced": True}:
                    raise SmokeFailed(f"step {step}: /update_weights answered {answer}")
                synced.append(step)
                probes.append(probe(base, str(model_dir)))
        client.cancel_job(job_id)
    published = broadcasts.published_versions(output_dir)
    if published != list(range(len(steps) + 1)):
        raise SmokeFailed(f"{output_dir}/broadcasts: published versions {published}")
    if probes[-1] == probes[0]:
        raise SmokeFailed(
            f"the sampler's greedy answer is the same after {len(steps)} steps at learning rate "
            f"{config.replay_learning_rate} as before: the weights did not reach it ({probes})"
        )
    summary = {
        "profile": profile.name,
        "mode": "adapters-replay",
        "orchestrator": NOT_RUN,
        "steps": steps,
        "losses": [r["loss"] for r in records],
        "trainable_tokens": [r["trainable_tokens"] for r in records],
        "published_versions": published,
        "synced_versions": synced,
        "probe_changed": True,
    }
    return run.summary(summary)


def main(config: Config) -> dict:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    profile = load_grpo_profile(config.profile, config.overrides)
    if os.environ.get(ENV_VAR):
        from recipes.rl.async_grpo import train

        fields = {k: getattr(config, k) for k in RUN_FIELDS}
        out = train.main(train.Config(**fields))
        return {"mode": "prime-rl", **out}
    log.warning("%s", NOT_RUN)
    return replay(config, profile)


if __name__ == "__main__":
    out = main(profiles.entrypoint(Config, GRPOProfile))
    keys = ("profile", "mode", "orchestrator", "losses", "published_versions")
    print(json.dumps({k: out.get(k) for k in keys}))
    sys.exit(0)
