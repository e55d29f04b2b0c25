"""TITO journey profiles (checked-in JSON): model, renderer, warm-start SFT, RL, budgets."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cortex_recipes.qualify import config_hash
from cortex_recipes.sft import ProfileError
from cortex_recipes.sub_jobs import trainer_and_sampler

_TOP = {
    "name", "description", "model", "renderer", "max_seq_len", "dtype", "n_gpus", "seed",
    "training", "warm_start", "rl", "eval", "ckpt",
}  # fmt: skip
_WARM = {"steps", "batch_size", "learning_rate"}
_RL = {
    "steps", "learning_rate", "tasks_per_step", "group_size", "max_turns", "max_tokens",
    "temperature", "eps_clip",
}  # fmt: skip
_EVAL = {"max_tokens"}
_CKPT = {"interval"}
RENDERERS = ("qwen3",)


@dataclass(frozen=True)
class TitoProfile:
    path: Path
    raw: dict[str, Any]

    @property
    def name(self) -> str:
        return self.raw["name"]

    @property
    def config_hash(self) -> str:
        return config_hash(self.raw)

    @property
    def warm(self) -> dict[str, Any]:
        return self.raw["warm_start"]

    @property
    def rl(self) -> dict[str, Any]:
        return self.raw["rl"]

    def sub_jobs(self) -> list:
        return trainer_and_sampler(
            self.raw,
            model=self.raw["model"],
            learning_rate=self.warm["learning_rate"],
            batch_size=self.warm["batch_size"],
            training=self.raw.get("training"),
        )


def _obj(path: Path, where: str, value: Any, allowed: set[str], required: set[str]) -> dict:
    if not isinstance(value, dict):
        raise ProfileError(f"{path}: {where} must be an object, got {value!r}")
    unknown = sorted(set(value) - allowed)
    if unknown:
        raise ProfileError(
            f"{path}: {where} has unknown keys {unknown}; accepted: {sorted(allowed)}"
        )
    missing = sorted(required - set(value))
    if missing:
        raise ProfileError(f"{path}: {where} is missing {missing}")
    return value


def _positive(path: Path, where: str, value: Any, kind=int) -> None:
    ok = not isinstance(value, bool) and isinstance(value, int if kind is int else int | float)
    if not ok or value <= 0:
        raise ProfileError(f"{path}: {where}={value!r} must be a positive {kind.__name__}")


def load_tito_profile(path: str | Path) -> TitoProfile:
    path = Path(path)
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ProfileError(f"profile {path} cannot be read: {exc}") from exc
    _obj(
        path, "profile", raw, _TOP, {"name", "model", "renderer", "max_seq_len", "warm_start", "rl"}
    )
    if raw["renderer"] not in RENDERERS:
        raise ProfileError(
            f"{path}: renderer={raw['renderer']!r}; accepted: {', '.join(RENDERERS)} (a renderer "
            "with a token-exact bridge between turns; chat-template rendering cannot guarantee "
            "token extension)"
        )
    warm = _obj(path, "warm_start", raw["warm_start"], _WARM, _WARM)
    rl = _obj(path, "rl", raw["rl"], _RL, _RL - {"eps_clip"})
    _obj(path, "eval", raw.get("eval", {}), _EVAL, set())
    _obj(path, "ckpt", raw.get("ckpt", {}), _CKPT, set())
    _positive(path, "max_seq_len", raw["max_seq_len"])
    _positive(path, "warm_start.batch_size", warm["batch_size"])
    _positive(path, "warm_start.learning_rate", warm["learning_rate"], float)
    if isinstance(warm["steps"], bool) or not isinstance(warm["steps"], int) or warm["steps"] < 0:
        raise ProfileError(f"{path}: warm_start.steps={warm['steps']!r} must be an integer >= 0")
    for key in ("steps", "tasks_per_step", "group_size", "max_turns", "max_tokens"):
        _positive(path, f"rl.{key}", rl[key])
    _positive(path, "rl.learning_rate", rl["learning_rate"], float)
    if rl["max_turns"] < 2:
        raise ProfileError(
            f"{path}: rl.max_turns={rl['max_turns']} must be >= 2: a tool episode needs a call "
            "turn and an answer turn"
        )
    if rl["group_size"] < 2:
        raise ProfileError(f"{path}: rl.group_size={rl['group_size']} must be >= 2")
    _positive(path, "ckpt.interval", raw.get("ckpt", {}).get("interval", 1))
    return TitoProfile(path=path, raw=raw)
