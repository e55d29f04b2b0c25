"""GRPO profiles (checked-in JSON) for the synchronous and asynchronous math journeys.

Field names follow prime-rl where it has one (``batch_size`` = rollouts per step,
``group_size``, ``max_steps``, ``max_async_level``, ``max_off_policy_steps``,
``ckpt.interval``, ``eval.interval``); docs/async-grpo.md maps them one by one.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cortex_recipes.qualify import config_hash
from cortex_recipes.rl.policy_lag import LagConfig, LagConfigError
from cortex_recipes.sft import ProfileError
from cortex_recipes.sub_jobs import trainer_and_sampler

_TOP = {
    "name", "description", "model", "max_seq_len", "dtype", "n_gpus", "seed", "max_steps",
    "trainer", "weight_format", "orchestrator", "env", "eval", "ckpt",
}  # fmt: skip
_TRAINER = {"learning_rate", "training", "loss"}
_ORCHESTRATOR = {
    "batch_size", "group_size", "max_async_level", "max_off_policy_steps",
    "max_inflight_groups", "sampling",
}  # fmt: skip
_ASYNC = {"max_async_level", "max_off_policy_steps", "max_inflight_groups"}
_SAMPLING = {"temperature", "max_tokens", "top_p"}
_ENV = {"dataset", "seed", "size", "config", "instruction", "latency_s"}
_EVAL = {"interval", "num_examples", "seed", "max_tokens"}
_CKPT = {"interval"}
_LOSS = {"eps_clip", "eps_clip_higher", "loss_agg_mode", "entropy_coeff"}


@dataclass(frozen=True)
class GRPOProfile:
    path: Path
    raw: dict[str, Any]

    @property
    def name(self) -> str:
        return self.raw["name"]

    @property
    def config_hash(self) -> str:
        return config_hash(self.raw)

    @property
    def orchestrator(self) -> dict[str, Any]:
        return self.raw["orchestrator"]

    @property
    def group_size(self) -> int:
        return self.orchestrator["group_size"]

    @property
    def groups_per_step(self) -> int:
        return self.orchestrator["batch_size"] // self.group_size

    @property
    def is_async(self) -> bool:
        return "max_async_level" in self.orchestrator

    def lag_config(self) -> LagConfig:
        o = self.orchestrator
        return LagConfig(
            groups_per_step=self.groups_per_step,
            max_async_level=o["max_async_level"],
            max_off_policy_steps=o["max_off_policy_steps"],
            max_inflight_groups=o.get("max_inflight_groups", 2 * self.groups_per_step),
        )

    def sampling_params(self) -> dict[str, Any]:
        s = self.orchestrator["sampling"]
        return {
            "max_tokens": s["max_tokens"],
            "temperature": s.get("temperature", 1.0),
            "top_p": s.get("top_p", 1.0),
        }

    def envs(self):
        """The training environment and the fixed eval set (same generator, the eval seed)."""
        from cortex_recipes.envs.math import MathEnv

        env_cfg, eval_cfg = self.raw["env"], self.raw.get("eval", {})
        extra = {"config": env_cfg.get("config")}
        if "instruction" in env_cfg:
            extra["instruction"] = env_cfg["instruction"]
        env = MathEnv(env_cfg["dataset"], seed=env_cfg["seed"], size=env_cfg["size"], **extra)
        eval_env = MathEnv(
            env_cfg["dataset"],
            seed=eval_cfg.get("seed", 12345),
            size=eval_cfg.get("num_examples", 32),
            **extra,
        )
        return env, eval_env

    def loss_config(self) -> dict[str, Any]:
        return dict(self.raw["trainer"].get("loss") or {})

    def sub_jobs(self) -> list:
        """Trainer and sampler on the same model (the sampler gets any LoRA shape)."""
        trainer = self.raw["trainer"]
        return trainer_and_sampler(
            self.raw,
            model=self.raw["model"],
            learning_rate=trainer["learning_rate"],
            batch_size=self.orchestrator["batch_size"],
            training=trainer.get("training"),
        )


def _check_keys(path: Path, where: str, value: Any, allowed: set[str], required=()) -> dict:
    if not isinstance(value, dict):
        raise ProfileError(f"{path}: {where} must be an object, got {value!r}")
    unknown = sorted(set(value) - allowed)
    if unknown:
        raise ProfileError(
            f"{path}: {where} has unknown keys {unknown}; accepted: {sorted(allowed)}"
        )
    missing = [k for k in required if k not in value]
    if missing:
        raise ProfileError(f"{path}: {where} is missing {missing}")
    return value


def _positive_int(path: Path, where: str, value: Any, minimum: int = 1) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ProfileError(f"{path}: {where}={value!r} must be an integer >= {minimum}")


def load_grpo_profile(path: str | Path) -> GRPOProfile:
    path = Path(path)
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ProfileError(f"profile {path} cannot be read: {exc}") from exc
    _check_keys(path, "profile", raw, _TOP, ("name", "model", "max_seq_len", "max_steps"))
    _check_keys(path, "trainer", raw.get("trainer"), _TRAINER, ("learning_rate",))
    orch = _check_keys(
        path, "orchestrator", raw.get("orchestrator"), _ORCHESTRATOR, ("batch_size", "group_size")
    )
    _check_keys(path, "orchestrator.sampling", orch.get("sampling"), _SAMPLING, ("max_tokens",))
    env = _check_keys(path, "env", raw.get("env"), _ENV, ("dataset", "seed", "size"))
    _check_keys(path, "eval", raw.get("eval", {}), _EVAL)
    _check_keys(path, "ckpt", raw.get("ckpt", {}), _CKPT)
    _check_keys(path, "trainer.loss", raw["trainer"].get("loss", {}), _LOSS)
    for where, value in (
        ("max_seq_len", raw["max_seq_len"]),
        ("max_steps", raw["max_steps"]),
        ("orchestrator.batch_size", orch["batch_size"]),
        ("orchestrator.group_size", orch["group_size"]),
        ("orchestrator.sampling.max_tokens", orch["sampling"]["max_tokens"]),
        ("env.size", env["size"]),
    ):
        _positive_int(path, where, value)
    if orch["group_size"] < 2:
        raise ProfileError(
            f"{path}: orchestrator.group_size={orch['group_size']} must be >= 2: "
            "group-relative advantages of a single rollout are always zero"
        )
    if orch["batch_size"] % orch["group_size"]:
        raise ProfileError(
            f"{path}: orchestrator.batch_size={orch['batch_size']} must be a multiple of "
            f"orchestrator.group_size={orch['group_size']}"
        )
    latency = env.get("latency_s", 0.0)
    if isinstance(latency, bool) or not isinstance(latency, int | float) or latency < 0:
        raise ProfileError(f"{path}: env.latency_s={latency!r} must be a number >= 0")
    for where, value in (
        ("eval.interval", raw.get("eval", {}).get("interval", 1)),
        ("ckpt.interval", raw.get("ckpt", {}).get("interval", 1)),
    ):
        _positive_int(path, where, value)
    if raw.get("weight_format", "hf") not in ("hf", "lora"):
        raise ProfileError(
            f"{path}: weight_format={raw.get('weight_format')!r}; accepted: hf, lora"
        )
    lora = (raw["trainer"].get("training") or {}).get("peft_config")
    if raw.get("weight_format") == "lora" and not lora:
        raise ProfileError(f"{path}: weight_format='lora' needs trainer.training.peft_config")
    present = _ASYNC & set(orch)
    if present and not {"max_async_level", "max_off_policy_steps"} <= present:
        raise ProfileError(
            f"{path}: an asynchronous profile sets both orchestrator.max_async_level and "
            f"orchestrator.max_off_policy_steps; got only {sorted(present)}"
        )
    profile = GRPOProfile(path=path, raw=raw)
    if profile.is_async:
        try:
            profile.lag_config()
        except LagConfigError as exc:
            raise ProfileError(f"{path}: orchestrator.{exc}") from exc
    return profile
