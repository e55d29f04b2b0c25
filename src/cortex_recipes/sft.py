"""The conversational SFT journey's pieces: profiles (checked-in configs), data, sub-jobs."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cortex_recipes.qualify import config_hash
from cortex_recipes.supervision import RENDERERS, TrainOnWhat

# DeepSpeed-owned batch fields that can disagree with training_config.train_batch_size.
DS_BATCH_FIELDS = (
    "train_batch_size",
    "train_micro_batch_size_per_gpu",
    "gradient_accumulation_steps",
)
_PROFILE_KEYS = {
    "name", "description", "model_name", "renderer", "train_on", "dataset", "max_seq_len",
    "batch_size", "steps", "learning_rate", "weight_decay", "seed", "dtype", "n_gpus",
    "training", "eval", "validated_on",
}  # fmt: skip


class ProfileError(ValueError):
    """A profile that cannot run; the message names the file and the field."""


@dataclass(frozen=True)
class EvalSpec:
    prompts: list[str]
    expect: str
    controls: list[dict[str, str]] = field(default_factory=list)
    max_tokens: int = 24


@dataclass(frozen=True)
class SFTProfile:
    path: Path
    name: str
    model_name: str
    renderer: str
    train_on: TrainOnWhat
    dataset: Path
    max_seq_len: int
    batch_size: int
    steps: int
    learning_rate: float
    weight_decay: float
    seed: int
    dtype: str
    n_gpus: int
    training: dict[str, Any]
    eval: EvalSpec | None
    raw: dict[str, Any]

    @property
    def config_hash(self) -> str:
        return config_hash(self.raw)

    def sub_jobs(self) -> list:
        """The sub-jobs this journey creates: the trainer, and the sampler that evaluates."""
        return [self.training_sub_job(), self.sampling_sub_job()]

    def training_sub_job(self, source_checkpoint_info: dict | None = None):
        from cortex_training import SubJobConfig

        extra = dict(self.training)
        clip = extra.pop("gradient_clipping", None)
        return SubJobConfig.training_job(
            self.model_name,
            optimizer={
                "name": "AdamW",
                "lr": self.learning_rate,
                "weight_decay": self.weight_decay,
            },
            max_seq_len=self.max_seq_len,
            train_batch_size=self.batch_size,
            n_gpus=self.n_gpus,
            gradient_clipping=clip,
            extra_training=extra or None,
            dtype=self.dtype,
            seed=self.seed,
            source_checkpoint_info=source_checkpoint_info,
        )

    def sampling_sub_job(self, source_checkpoint_info: dict | None = None):
        from cortex_training import SubJobConfig

        return SubJobConfig.sampling_job(
            self.model_name,
            max_seq_len=self.max_seq_len,
            n_gpus=self.n_gpus,
            dtype=self.dtype,
            seed=self.seed,
            source_checkpoint_info=source_checkpoint_info,
        )


def _require(raw: dict, key: str, kind: type | tuple, where: str):
    value = raw.get(key)
    if isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,)):
        raise ProfileError(f"{where}: {key}={value!r} must be {kind}")
    if not isinstance(value, kind):
        raise ProfileError(f"{where}: {key}={value!r} is required and must be {kind}")
    return value


def check_ds_batch_fields(
    training: dict[str, Any], batch_size: int, n_gpus: int, where: str
) -> None:
    """Reject DeepSpeed batch fields that disagree with the profile's batch size."""
    ds = training.get("ds_config") or {}
    if not isinstance(ds, dict):
        raise ProfileError(f"{where}: training.ds_config must be an object")
    if "train_batch_size" in ds and ds["train_batch_size"] != batch_size:
        raise ProfileError(
            f"{where}: training.ds_config.train_batch_size={ds['train_batch_size']!r} disagrees "
            f"with batch_size={batch_size}; remove it (batch_size is the one source of truth)"
        )
    micro = ds.get("train_micro_batch_size_per_gpu")
    accum = ds.get("gradient_accumulation_steps")
    if micro is not None or accum is not None:
        product = (micro or 1) * (accum or 1) * n_gpus
        if product != batch_size:
            raise ProfileError(
                f"{where}: training.ds_config train_micro_batch_size_per_gpu={micro!r} x "
                f"gradient_accumulation_steps={accum!r} x n_gpus={n_gpus} = {product} disagrees "
                f"with batch_size={batch_size}; remove them"
            )


def load_profile(path: str | Path) -> SFTProfile:
    path = Path(path)
    where = str(path)
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError as exc:
        raise ProfileError(f"profile {where} does not exist") from exc
    except ValueError as exc:
        raise ProfileError(f"profile {where} is not valid JSON: {exc}") from exc
    if not isinstance(raw, dict):
        raise ProfileError(f"profile {where} must hold a JSON object")
    unknown = sorted(set(raw) - _PROFILE_KEYS)
    if unknown:
        raise ProfileError(f"{where}: unknown keys {unknown}; accepted: {sorted(_PROFILE_KEYS)}")
    renderer = raw.get("renderer", "chat_template")
    if renderer not in RENDERERS:
        raise ProfileError(f"{where}: renderer={renderer!r}; accepted: {', '.join(RENDERERS)}")
    try:
        train_on = TrainOnWhat(raw.get("train_on", TrainOnWhat.ALL_ASSISTANT_MESSAGES))
    except ValueError as exc:
        accepted = ", ".join(t.value for t in TrainOnWhat)
        raise ProfileError(
            f"{where}: train_on={raw.get('train_on')!r}; accepted: {accepted}"
        ) from exc
    batch_size = _require(raw, "batch_size", int, where)
    n_gpus = raw.get("n_gpus", 1)
    training = raw.get("training", {})
    if not isinstance(training, dict):
        raise ProfileError(f"{where}: training must be an object")
    check_ds_batch_fields(training, batch_size, n_gpus, where)
    for positive in ("batch_size", "steps", "max_seq_len"):
        if _require(raw, positive, int, where) <= 0:
            raise ProfileError(f"{where}: {positive}={raw[positive]!r} must be > 0")
    dataset = raw.get("dataset")
    if not isinstance(dataset, str):
        raise ProfileError(f"{where}: dataset must be a path (relative to the recipe folder)")
    eval_raw = raw.get("eval")
    eval_spec = None
    if eval_raw is not None:
        try:
            eval_spec = EvalSpec(**eval_raw)
        except TypeError as exc:
            raise ProfileError(f"{where}: eval: {exc}") from exc
    return SFTProfile(
        path=path,
        name=_require(raw, "name", str, where),
        model_name=_require(raw, "model_name", str, where),
        renderer=renderer,
        train_on=train_on,
        dataset=(path.parent.parent / dataset).resolve(),
        max_seq_len=raw["max_seq_len"],
        batch_size=batch_size,
        steps=raw["steps"],
        learning_rate=float(_require(raw, "learning_rate", (int, float), where)),
        weight_decay=float(raw.get("weight_decay", 0.0)),
        seed=int(raw.get("seed", 0)),
        dtype=raw.get("dtype", "float32"),
        n_gpus=n_gpus,
        training=training,
        eval=eval_spec,
        raw=raw,
    )


def load_conversations(path: Path) -> list[list[dict[str, Any]]]:
    """One conversation per JSONL line: ``{"messages": [...]}``."""
    conversations = []
    for n, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError as exc:
            raise ProfileError(f"{path}:{n} is not valid JSON: {exc}") from exc
        messages = record.get("messages") if isinstance(record, dict) else None
        if not isinstance(messages, list) or not messages:
            raise ProfileError(f"{path}:{n} needs a non-empty messages list")
        conversations.append(messages)
    if not conversations:
        raise ProfileError(f"{path} holds no conversations")
    return conversations


def batches(n_examples: int, batch_size: int, steps: int, seed: int) -> list[list[int]]:
    """Example indices per step: seeded shuffled epochs, concatenated; deterministic."""
    rng = random.Random(seed)
    order: list[int] = []
    while len(order) < batch_size * steps:
        epoch = list(range(n_examples))
        rng.shuffle(epoch)
        order.extend(epoch)
    return [order[i * batch_size : (i + 1) * batch_size] for i in range(steps)]
