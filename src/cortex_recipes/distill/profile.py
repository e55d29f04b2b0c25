"""On-policy distillation profiles (checked-in JSON configs)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cortex_recipes.qualify import config_hash
from cortex_recipes.sft import ProfileError

_KEYS = {
    "name", "description", "student_model", "teacher_model", "prompts", "max_seq_len",
    "rollouts_per_step", "max_tokens", "temperature", "steps", "learning_rate", "seed",
    "dtype", "n_gpus", "training", "teacher_tau", "teacher_clip", "teacher_clip_negative",
    "eps_clip", "weight_format",
}  # fmt: skip


@dataclass(frozen=True)
class OPDProfile:
    path: Path
    raw: dict[str, Any]

    def __getattr__(self, key: str) -> Any:
        if key in _KEYS:
            return self.raw.get(key)
        raise AttributeError(key)

    @property
    def config_hash(self) -> str:
        return config_hash(self.raw)

    @property
    def prompts_path(self) -> Path:
        return (self.path.parent.parent / self.raw["prompts"]).resolve()

    def grpo_config(self) -> dict[str, Any]:
        config = {"eps_clip": self.raw.get("eps_clip", 0.2), "teacher_tau": self.raw["teacher_tau"]}
        if self.raw["teacher_tau"] > 0:
            config["teacher_clip"] = self.raw["teacher_clip"]
            if self.raw.get("teacher_clip_negative") is not None:
                config["teacher_clip_negative"] = self.raw["teacher_clip_negative"]
        return config

    def sub_jobs(self) -> list:
        """Student trainer, student sampler, frozen teacher -- the sampler before the teacher,
        because the SDK checks prompt lengths against the first inference_config it finds."""
        from cortex_training import JobType, SubJobConfig

        common = {
            "max_seq_len": self.max_seq_len,
            "n_gpus": self.raw.get("n_gpus", 1),
            "dtype": self.raw.get("dtype", "float32"),
            "seed": self.seed,
        }
        training = dict(self.raw.get("training") or {})
        lora = training.get("peft_config")
        return [
            SubJobConfig.training_job(
                self.student_model,
                optimizer={"name": "AdamW", "lr": self.learning_rate, "weight_decay": 0.0},
                train_batch_size=self.rollouts_per_step,
                extra_training=training or None,
                **common,
            ),
            SubJobConfig.sampling_job(
                self.student_model, extra_sampling={"peft_config": lora} if lora else None, **common
            ),
            SubJobConfig.sampling_job(
                self.teacher_model, job_type=JobType.LOG_PROBABILITY, **common
            ),
        ]


def load_opd_profile(path: str | Path) -> OPDProfile:
    path = Path(path)
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ProfileError(f"profile {path} cannot be read: {exc}") from exc
    if not isinstance(raw, dict):
        raise ProfileError(f"profile {path} must hold a JSON object")
    unknown = sorted(set(raw) - _KEYS)
    if unknown:
        raise ProfileError(f"{path}: unknown keys {unknown}; accepted: {sorted(_KEYS)}")
    for key in ("name", "student_model", "teacher_model", "prompts"):
        if not isinstance(raw.get(key), str) or not raw[key]:
            raise ProfileError(f"{path}: {key} is required and must be a string")
    for key in ("max_seq_len", "rollouts_per_step", "max_tokens", "steps"):
        value = raw.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ProfileError(f"{path}: {key}={value!r} must be a positive integer")
    tau = raw.get("teacher_tau")
    if isinstance(tau, bool) or not isinstance(tau, int | float) or tau < 0:
        raise ProfileError(f"{path}: teacher_tau={tau!r} must be a number >= 0")
    clip = raw.get("teacher_clip")
    if tau > 0 and (isinstance(clip, bool) or not isinstance(clip, int | float) or clip <= 0):
        raise ProfileError(f"{path}: teacher_tau={tau} needs a positive teacher_clip, got {clip!r}")
    if raw.get("weight_format", "hf") not in ("hf", "lora"):
        raise ProfileError(
            f"{path}: weight_format={raw.get('weight_format')!r}; accepted: hf, lora"
        )
    return OPDProfile(path=path, raw=raw)
