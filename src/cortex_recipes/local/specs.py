"""Validation of create-job bodies: sub-job configs, optimizer blocks and LoRA configs.

Runs in the server before any worker starts, so a bad config is a 400 that names the field.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from cortex_recipes.local.errors import BackendError

JOB_TYPES = ("training", "sampling", "log_probability")
SUB_JOB_SEGMENT = {"training": "training", "sampling": "sampling", "log_probability": "log_prob"}
DTYPES = ("float32", "bfloat16", "float16")
CHECKPOINT_ID_RE = re.compile(r"^cp_[0-9a-f]{32}$")
JOB_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")

_ADAMW_KEYS = {"name", "type", "lr", "weight_decay", "betas", "beta1", "beta2", "eps", "fused"}
_SCHEDULER_KEYS = {"lr_scheduler", "scheduler", "warmup_steps", "warmup_ratio", "lr_decay"}
_LORA_KEYS = {
    "peft_type", "task_type", "r", "lora_alpha", "lora_dropout", "bias", "target_modules",
    "target_parameters",
}  # fmt: skip


@dataclass(frozen=True)
class OptimizerSpec:
    lr: float
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8


@dataclass(frozen=True)
class LoraSpec:
    r: int
    lora_alpha: float
    lora_dropout: float
    target_modules: Any

    def as_dict(self) -> dict[str, Any]:
        return {
            "r": self.r,
            "lora_alpha": self.lora_alpha,
            "lora_dropout": self.lora_dropout,
            "target_modules": self.target_modules,
        }


@dataclass
class SubJobSpec:
    sub_job_id: str
    job_type: str
    model_name: str
    dtype: str
    seed: int
    max_seq_len: int
    raw: dict[str, Any]
    optimizer: OptimizerSpec | None = None
    gradient_clipping: float | None = None
    load_optimizer_states: bool = True
    lora: LoraSpec | None = None
    source_checkpoint: dict[str, str] | None = None
    ignored_keys: list[str] = field(default_factory=list)

    def to_wire(self) -> dict[str, Any]:
        return {"sub_job_id": self.sub_job_id, **self.raw}


def _positive_int(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise BackendError(f"{where}={value!r} must be a positive integer")
    return value


def _finite(value: Any, where: str, *, minimum: float | None = None) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value != value:
        raise BackendError(f"{where}={value!r} must be a number")
    if minimum is not None and value < minimum:
        raise BackendError(f"{where}={value!r} must be >= {minimum}")
    return float(value)


def parse_optimizer(block: Any, where: str) -> OptimizerSpec:
    if not isinstance(block, dict) or not block:
        raise BackendError(f"{where} is required and must be a non-empty object")
    if "params" in block and isinstance(block["params"], dict):  # DeepSpeed style
        block = {"name": block.get("type", block.get("name")), **block["params"]}
    scheduler = set(block) & _SCHEDULER_KEYS
    if scheduler:
        raise BackendError(
            f"{where} has scheduler keys {sorted(scheduler)}; drive the learning rate per step "
            f"with step(learning_rate=...) instead"
        )
    unknown = set(block) - _ADAMW_KEYS
    if unknown:
        raise BackendError(
            f"{where} has unknown keys {sorted(unknown)}; accepted: {', '.join(sorted(_ADAMW_KEYS))}"
        )
    name = str(block.get("name") or block.get("type") or "AdamW")
    if name.lower() not in ("adamw", "adam_w"):
        raise BackendError(f"{where}.name={name!r}: the local backend implements only AdamW")
    if "lr" not in block:
        raise BackendError(f"{where}.lr is required")
    betas = block.get("betas", [block.get("beta1", 0.9), block.get("beta2", 0.999)])
    if not isinstance(betas, list | tuple) or len(betas) != 2:
        raise BackendError(f"{where}.betas={betas!r} must be a pair of numbers")
    return OptimizerSpec(
        lr=_finite(block["lr"], f"{where}.lr", minimum=0.0),
        weight_decay=_finite(block.get("weight_decay", 0.0), f"{where}.weight_decay", minimum=0.0),
        betas=(_finite(betas[0], f"{where}.betas[0]"), _finite(betas[1], f"{where}.betas[1]")),
        eps=_finite(block.get("eps", 1e-8), f"{where}.eps", minimum=0.0),
    )


def parse_lora(block: Any, where: str) -> LoraSpec | None:
    if block is None:
        return None
    if not isinstance(block, dict):
        raise BackendError(f"{where} must be an object")
    unknown = set(block) - _LORA_KEYS
    if unknown:
        raise BackendError(
            f"{where} has unknown keys {sorted(unknown)}; accepted: {', '.join(sorted(_LORA_KEYS))}"
        )
    if str(block.get("peft_type", "Lora")).lower() != "lora":
        raise BackendError(
            f"{where}.peft_type={block.get('peft_type')!r}: only 'Lora' is supported"
        )
    if block.get("bias", "none") != "none":
        raise BackendError(f"{where}.bias={block.get('bias')!r}: only 'none' is supported")
    if "target_parameters" in block:
        raise BackendError(f"{where}.target_parameters is not supported by the local backend")
    targets = block.get("target_modules", "all-linear")
    if not (isinstance(targets, str) or (isinstance(targets, list) and targets)):
        raise BackendError(f"{where}.target_modules={targets!r} must be a name list or a string")
    return LoraSpec(
        r=_positive_int(block.get("r", 8), f"{where}.r"),
        lora_alpha=_finite(block.get("lora_alpha", 8), f"{where}.lora_alpha", minimum=0.0),
        lora_dropout=_finite(block.get("lora_dropout", 0.0), f"{where}.lora_dropout", minimum=0.0),
        target_modules=targets,
    )


def parse_sub_jobs(job_id: str, configs: Any) -> list[SubJobSpec]:
    if not isinstance(configs, list) or not configs:
        raise BackendError("sub_job_configs must be a non-empty list")
    specs: list[SubJobSpec] = []
    counts = dict.fromkeys(JOB_TYPES, 0)
    for i, cfg in enumerate(configs):
        where = f"sub_job_configs[{i}]"
        if not isinstance(cfg, dict):
            raise BackendError(f"{where} must be an object")
        job_type = str(cfg.get("job_type") or "").lower()
        if job_type not in JOB_TYPES:
            raise BackendError(
                f"{where}.job_type={cfg.get('job_type')!r}; accepted: {', '.join(JOB_TYPES)}"
            )
        model_name = cfg.get("model_name")
        if not isinstance(model_name, str) or not model_name:
            raise BackendError(f"{where}.model_name is required")
        dtype = cfg.get("dtype") or "float32"
        if dtype not in DTYPES:
            raise BackendError(f"{where}.dtype={dtype!r}; accepted: {', '.join(DTYPES)}")
        seed = cfg.get("seed", 0)
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise BackendError(f"{where}.seed={seed!r} must be an integer")
        index = counts[job_type]
        counts[job_type] += 1
        spec = SubJobSpec(
            sub_job_id=f"{job_id}:{SUB_JOB_SEGMENT[job_type]}:{index}",
            job_type=job_type,
            model_name=model_name,
            dtype=dtype,
            seed=seed,
            max_seq_len=0,
            raw=dict(cfg),
        )
        key, other = (
            ("training_config", "inference_config")
            if job_type == "training"
            else ("inference_config", "training_config")
        )
        block = cfg.get(key)
        if not isinstance(block, dict):
            raise BackendError(f"{where}.{key} is required for a {job_type} sub-job")
        if other in cfg:
            raise BackendError(f"{where} has both training_config and inference_config")
        spec.max_seq_len = _positive_int(block.get("max_seq_len"), f"{where}.{key}.max_seq_len")
        _positive_int(block.get("n_gpus"), f"{where}.{key}.n_gpus")
        spec.lora = parse_lora(block.get("peft_config"), f"{where}.{key}.peft_config")
        if job_type == "training":
            _positive_int(block.get("train_batch_size"), f"{where}.{key}.train_batch_size")
            spec.optimizer = parse_optimizer(block.get("optimizer"), f"{where}.{key}.optimizer")
            if block.get("gradient_clipping") is not None:
                spec.gradient_clipping = _finite(
                    block["gradient_clipping"], f"{where}.{key}.gradient_clipping", minimum=0.0
                )
            spec.load_optimizer_states = bool(block.get("load_optimizer_states", True))
        source = cfg.get("source_checkpoint_info")
        if source is not None:
            if not isinstance(source, dict) or not isinstance(source.get("checkpoint_id"), str):
                raise BackendError(f"{where}.source_checkpoint_info needs a checkpoint_id")
            spec.source_checkpoint = {
                "checkpoint_id": source["checkpoint_id"],
                "source_job_id": source.get("source_job_id") or job_id,
            }
        specs.append(spec)
    if counts["training"] > 1:
        raise BackendError("at most one training sub-job is supported per job")
    return specs
