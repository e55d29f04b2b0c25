"""Create-job bodies -> typed sub-job specs, and the worker spec the server hands a worker.

Runs in the server before any worker starts, so a bad config is a 400 that names the field.
:class:`WorkerSpec` is the one typed contract between the server side and ``worker.py``: the
server writes it as JSON, the worker reads it back with :meth:`WorkerSpec.from_json`.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from typing import Any

from cortex_recipes.local.errors import BackendError

JOB_TYPES = ("training", "sampling", "log_probability")
SUB_JOB_SEGMENT = {"training": "training", "sampling": "sampling", "log_probability": "log_prob"}
DTYPES = ("float32", "bfloat16", "float16")
# Patterns are matched with ``fullmatch`` (a ``$`` anchor would accept a trailing newline).
CHECKPOINT_ID_RE = re.compile(r"cp_[0-9a-f]{32}")
JOB_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")
# A model name is a hub id, a fixture name or a directory path; longer ones are not names.
MAX_MODEL_NAME_CHARS = 512
# torch seeds are 64-bit; anything outside [0, 2**64) cannot seed a generator.
MAX_SEED = 2**64 - 1
# No optimizer this backend runs is sane above a learning rate of 1.0 (a typo, not a choice).
MAX_LEARNING_RATE = 1.0

# The longest sequence a sub-job may declare; far above any journey, low enough that a typo
# does not size buffers for it.
MAX_SEQ_LEN = 1 << 20

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


# Continuous-batching limits of a sampling sub-job, set per sub-job in
# inference_config.vllm_config (max_num_seqs and max_num_batched_tokens are vLLM's engine
# argument names; max_queued_rows is the local backend's own). The defaults let one generate
# request of validation.MAX_PROMPTS (4096) rows queue whole.
DEFAULT_MAX_NUM_SEQS = 256
DEFAULT_MAX_NUM_BATCHED_TOKENS = 262_144
DEFAULT_MAX_QUEUED_ROWS = 8192
BATCH_LIMIT_KEYS = ("max_num_seqs", "max_num_batched_tokens", "max_queued_rows")
MAX_BATCH_LIMIT = 2**24


@dataclass
class SubJobSpec:
    sub_job_id: str
    job_type: str
    model_name: str
    dtype: str | None  # None: bfloat16 on a GPU, float32 on the CPU (devices.resolve_dtype)
    seed: int
    max_seq_len: int
    n_gpus: int
    raw: dict[str, Any]
    optimizer: OptimizerSpec | None = None
    gradient_clipping: float | None = None
    load_optimizer_states: bool = True
    lora: LoraSpec | None = None
    source_checkpoint: dict[str, str] | None = None
    # Sampling sub-jobs: rows decoded at once, tokens (prompt + max_tokens) they may hold, and
    # rows that may wait beyond them before generate answers 429 (docs/local-backend.md).
    max_num_seqs: int = DEFAULT_MAX_NUM_SEQS
    max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS
    max_queued_rows: int = DEFAULT_MAX_QUEUED_ROWS

    def to_wire(self) -> dict[str, Any]:
        return {"sub_job_id": self.sub_job_id, **self.raw}


@dataclass(frozen=True)
class WorkerSpec:
    """Everything a worker process needs to build its sub-job; JSON both ways."""

    job_id: str
    sub_job_id: str
    job_type: str
    model_name: str
    dtype: str
    device: str  # "cpu" or "cuda:<i>" in the server's numbering
    seed: int
    max_seq_len: int
    threads: int
    lora: dict[str, Any] | None = None
    optimizer: dict[str, Any] | None = None
    gradient_clipping: float | None = None
    load_optimizer_states: bool = True
    source_checkpoint_dir: str | None = None
    max_num_seqs: int = 0  # 0 for sub-jobs that do not sample
    max_num_batched_tokens: int = 0

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> WorkerSpec:
        data = json.loads(text)
        unknown = set(data) - set(cls.__dataclass_fields__)
        if unknown:
            raise ValueError(f"worker spec has unknown keys {sorted(unknown)}")
        return cls(**data)


def _positive_int(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise BackendError(f"{where}={value!r} must be a positive integer")
    return value


def _finite(
    value: Any, where: str, *, minimum: float | None = None, maximum: float | None = None
) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value != value:
        raise BackendError(f"{where}={abridge(value)} must be a number")
    if value in (float("inf"), float("-inf")):
        raise BackendError(f"{where}={value!r} must be finite")
    if minimum is not None and value < minimum:
        raise BackendError(f"{where}={abridge(value)} must be >= {minimum}")
    if maximum is not None and value > maximum:
        raise BackendError(f"{where}={abridge(value)} must be <= {maximum}")
    return float(value)


def abridge(value: Any, limit: int = 80) -> str:
    """``repr(value)`` cut to ``limit`` characters, for error messages."""
    try:
        text = repr(value)
    except Exception:  # a repr that fails must not turn a 400 into a 500
        text = f"<{type(value).__name__}>"
    return text if len(text) <= limit else f"{text[: limit - 3]}..."


def reject_unknown_keys(mapping: dict, accepted, where: str) -> None:
    """A 400 naming the keys of ``mapping`` outside ``accepted`` and listing ``accepted``."""
    unknown = set(mapping) - set(accepted)
    if unknown:
        raise BackendError(
            f"{where} has unknown keys {sorted(map(str, unknown))}; "
            f"accepted: {', '.join(sorted(accepted))}"
        )


def learning_rate(value: Any, where: str) -> float:
    """A learning rate in [0, MAX_LEARNING_RATE]."""
    return _finite(value, where, minimum=0.0, maximum=MAX_LEARNING_RATE)


def seed_value(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_SEED:
        raise BackendError(f"{where}={abridge(value)} must be an integer in [0, 2**64)")
    return value


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
    reject_unknown_keys(block, _ADAMW_KEYS, where)
    name = str(block.get("name") or block.get("type") or "AdamW")
    if name.lower() not in ("adamw", "adam_w"):
        raise BackendError(f"{where}.name={name!r}: the local backend implements only AdamW")
    if "lr" not in block:
        raise BackendError(f"{where}.lr is required")
    betas = block.get("betas", [block.get("beta1", 0.9), block.get("beta2", 0.999)])
    if not isinstance(betas, list | tuple) or len(betas) != 2:
        raise BackendError(f"{where}.betas={betas!r} must be a pair of numbers")
    return OptimizerSpec(
        lr=learning_rate(block["lr"], f"{where}.lr"),
        weight_decay=_finite(block.get("weight_decay", 0.0), f"{where}.weight_decay", minimum=0.0),
        betas=(
            _finite(betas[0], f"{where}.betas[0]", minimum=0.0, maximum=0.999999),
            _finite(betas[1], f"{where}.betas[1]", minimum=0.0, maximum=0.999999),
        ),
        eps=_finite(block.get("eps", 1e-8), f"{where}.eps", minimum=0.0),
    )


def parse_lora(block: Any, where: str) -> LoraSpec | None:
    if block is None:
        return None
    if not isinstance(block, dict):
        raise BackendError(f"{where} must be an object")
    reject_unknown_keys(block, _LORA_KEYS, where)
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


def _batch_limits(spec: SubJobSpec, block: Any, where: str) -> None:
    """The sampling limits in ``vllm_config`` (other vllm_config keys pass through)."""
    if block is None:
        return
    if not isinstance(block, dict):
        raise BackendError(f"{where}={abridge(block)} must be an object")
    for name in BATCH_LIMIT_KEYS:
        if block.get(name) is None:
            continue
        value = _positive_int(block[name], f"{where}.{name}")
        if value > MAX_BATCH_LIMIT:
            raise BackendError(f"{where}.{name}={value} is above {MAX_BATCH_LIMIT}")
        setattr(spec, name, value)


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
        if len(model_name) > MAX_MODEL_NAME_CHARS or "\x00" in model_name:
            raise BackendError(
                f"{where}.model_name={abridge(model_name)} is not a model name "
                f"(at most {MAX_MODEL_NAME_CHARS} characters, no NUL)"
            )
        dtype = cfg.get("dtype")
        if dtype is not None and dtype not in DTYPES:
            raise BackendError(f"{where}.dtype={abridge(dtype)}; accepted: {', '.join(DTYPES)}")
        seed = seed_value(cfg.get("seed", 0), f"{where}.seed")
        index = counts[job_type]
        counts[job_type] += 1
        spec = SubJobSpec(
            sub_job_id=f"{job_id}:{SUB_JOB_SEGMENT[job_type]}:{index}",
            job_type=job_type,
            model_name=model_name,
            dtype=dtype,
            seed=seed,
            max_seq_len=0,
            n_gpus=0,
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
        if spec.max_seq_len > MAX_SEQ_LEN:
            raise BackendError(
                f"{where}.{key}.max_seq_len={spec.max_seq_len} is above {MAX_SEQ_LEN}"
            )
        spec.n_gpus = _positive_int(block.get("n_gpus"), f"{where}.{key}.n_gpus")
        spec.lora = parse_lora(block.get("peft_config"), f"{where}.{key}.peft_config")
        if job_type == "sampling":
            _batch_limits(spec, block.get("vllm_config"), f"{where}.{key}.vllm_config")
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
            checkpoint_id = source["checkpoint_id"]
            source_job = source.get("source_job_id") or job_id
            if not CHECKPOINT_ID_RE.fullmatch(checkpoint_id):
                raise BackendError(
                    f"{where}.source_checkpoint_info.checkpoint_id={abridge(checkpoint_id)} "
                    "is not a checkpoint id (cp_<32 hex>)"
                )
            if not isinstance(source_job, str) or not JOB_ID_RE.fullmatch(source_job):
                raise BackendError(
                    f"{where}.source_checkpoint_info.source_job_id={abridge(source_job)} "
                    "is not a job id"
                )
            spec.source_checkpoint = {"checkpoint_id": checkpoint_id, "source_job_id": source_job}
        specs.append(spec)
    if counts["training"] > 1:
        raise BackendError("at most one training sub-job is supported per job")
    return specs
