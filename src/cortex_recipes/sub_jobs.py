"""REST ``sub_job_configs`` entries -> the SDK's ``SubJobConfig`` factories, validated.

A sub-job written as JSON (in a config or the model catalog) is rebuilt with
``SubJobConfig.training_job`` / ``SubJobConfig.sampling_job``, checked with the SDK's own
``validate()``, and must serialise back to exactly the JSON it came from, so nothing in it is
silently dropped or renamed.
"""

from __future__ import annotations

from typing import Any

_TOP_LEVEL = {
    "job_type", "model_name", "global_batch_size", "dtype", "seed", "model_post_init",
    "source_checkpoint_info", "training_config", "inference_config",
}  # fmt: skip
_COMMON = ("global_batch_size", "dtype", "seed", "model_post_init", "source_checkpoint_info")
_TRAINING_REQUIRED = ("optimizer", "max_seq_len", "train_batch_size", "n_gpus")
_TRAINING_OPTIONAL = ("gradient_clipping", "multiplex_job_id", "load_optimizer_states")
_INFERENCE_REQUIRED = ("max_seq_len", "n_gpus")
_INFERENCE_NAMED = (*_INFERENCE_REQUIRED, "multiplex_job_id")


class SubJobError(ValueError):
    """A sub-job the SDK would not accept; the message names the field and the value."""


def build_sub_job(wire: Any, where: str):
    """The validated ``SubJobConfig`` for one ``sub_job_configs`` entry."""
    from cortex_training import JobType, SubJobConfig

    if not isinstance(wire, dict):
        raise SubJobError(f"{where}: must be an object, got {wire!r}")
    unknown = sorted(set(wire) - _TOP_LEVEL)
    if unknown:
        raise SubJobError(f"{where}: unknown fields {unknown}; accepted: {sorted(_TOP_LEVEL)}")
    accepted = [t.value for t in JobType]
    job_type = wire.get("job_type")
    if job_type not in accepted:
        raise SubJobError(f"{where}: job_type={job_type!r}; accepted: {', '.join(accepted)}")
    model_name = wire.get("model_name")
    if not isinstance(model_name, str) or not model_name:
        raise SubJobError(f"{where}: model_name={model_name!r} must be a non-empty string")
    common = {key: wire[key] for key in _COMMON if key in wire}
    try:
        if job_type == JobType.TRAINING.value:
            block = _config_block(
                wire, "training_config", "inference_config", _TRAINING_REQUIRED, where
            )
            sub_job = SubJobConfig.training_job(
                model_name,
                **{key: block.pop(key) for key in _TRAINING_REQUIRED},
                **{key: block.pop(key) for key in _TRAINING_OPTIONAL if key in block},
                extra_training=block or None,
                **common,
            )
        else:
            block = _config_block(
                wire, "inference_config", "training_config", _INFERENCE_REQUIRED, where
            )
            named = {key: block.pop(key) for key in _INFERENCE_NAMED if key in block}
            sub_job = SubJobConfig.sampling_job(
                model_name,
                **named,
                extra_sampling=block or None,
                job_type=JobType(job_type),
                **common,
            )
        sub_job.validate()
    except SubJobError:
        raise
    except (TypeError, ValueError) as exc:  # the SDK compares with <=, so a string is a TypeError
        raise SubJobError(f"{where}: the SDK rejects it: {exc}") from exc
    if sub_job.to_wire() != wire:
        raise SubJobError(
            f"{where}: does not survive the SDK round trip; it would be sent as "
            f"{sub_job.to_wire()!r}"
        )
    return sub_job


def _config_block(
    wire: dict, name: str, other: str, required: tuple[str, ...], where: str
) -> dict[str, Any]:
    if other in wire:
        raise SubJobError(f"{where}: job_type={wire['job_type']!r} takes {name}, not {other}")
    block = wire.get(name)
    if not isinstance(block, dict):
        raise SubJobError(f"{where}: {name} is required and must be an object, got {block!r}")
    missing = [key for key in required if key not in block]
    if missing:
        raise SubJobError(f"{where}: {name} is missing {missing}")
    return dict(block)


def build_sub_jobs(wires: Any, where: str) -> list:
    """All entries of a ``sub_job_configs`` list; a job holds at most one training sub-job."""
    if not isinstance(wires, list) or not wires:
        raise SubJobError(f"{where}: must be a non-empty list of sub-job objects")
    sub_jobs = [build_sub_job(w, f"{where}[{i}]") for i, w in enumerate(wires)]
    training = sum(s.job_type.value == "training" for s in sub_jobs)
    if training > 1:
        raise SubJobError(f"{where}: {training} training sub-jobs; a job holds at most one")
    return sub_jobs


# DeepSpeed-owned batch fields: derived from the profile's global batch size and n_gpus, never
# sent from a profile (a value there could disagree with train_batch_size).
DS_BATCH_FIELDS = (
    "train_batch_size",
    "train_micro_batch_size_per_gpu",
    "gradient_accumulation_steps",
)


def batch_problem(training: dict[str, Any], batch_size: int, n_gpus: int, field: str) -> str | None:
    """Why a profile's batch settings cannot be sent, or None. ``batch_size`` (named by
    ``field``) is the global batch: examples per optimiser step across all ``n_gpus``."""
    if batch_size % n_gpus:
        return (
            f"{field}={batch_size} is the global batch and must be a multiple of "
            f"n_gpus={n_gpus} (each GPU gets {field} / n_gpus)"
        )
    ds = training.get("ds_config") or {}
    if not isinstance(ds, dict):
        return f"training.ds_config={ds!r} must be an object"
    owned = [key for key in DS_BATCH_FIELDS if key in ds]
    if owned:
        return (
            f"training.ds_config sets {owned}; remove them: they are derived from "
            f"{field}={batch_size} (global) and n_gpus={n_gpus}, the one source of truth"
        )
    return None


def trainer_sub_job(
    model: str,
    *,
    max_seq_len: int,
    n_gpus: int,
    dtype: str,
    seed: int,
    learning_rate: float,
    batch_size: int,
    training: dict[str, Any] | None = None,
    weight_decay: float = 0.0,
    source_checkpoint_info: dict | None = None,
):
    """The training sub-job: AdamW at ``learning_rate``; ``batch_size`` is the global batch
    (examples per optimiser step across all GPUs), sent as both ``global_batch_size`` and
    ``train_batch_size``: the rows of one step, as the SDK's own recipes read
    ``training_config.train_batch_size`` (the SDK's reference, section 3), while the service
    shards them over the ``n_gpus`` ranks (``batch_size / n_gpus`` rows each, which is why
    ``batch_size`` must be a multiple of ``n_gpus``). ``training`` is passed through to
    ``training_config`` (``gradient_clipping`` by name)."""
    from cortex_training import SubJobConfig

    extra = dict(training or {})
    clip = extra.pop("gradient_clipping", None)
    return SubJobConfig.training_job(
        model,
        optimizer={"name": "AdamW", "lr": learning_rate, "weight_decay": weight_decay},
        max_seq_len=max_seq_len,
        train_batch_size=batch_size,
        global_batch_size=batch_size,
        n_gpus=n_gpus,
        gradient_clipping=clip,
        extra_training=extra or None,
        dtype=dtype,
        seed=seed,
        source_checkpoint_info=source_checkpoint_info,
    )


def sampler_sub_job(
    model: str,
    *,
    max_seq_len: int,
    n_gpus: int,
    dtype: str,
    seed: int,
    lora: dict[str, Any] | None = None,
    job_type: str = "sampling",
    source_checkpoint_info: dict | None = None,
):
    """A sampling (or ``log_probability``) sub-job; ``lora`` gives it the trainer's adapter
    shape, so LoRA weight sync has somewhere to land."""
    from cortex_training import JobType, SubJobConfig

    return SubJobConfig.sampling_job(
        model,
        max_seq_len=max_seq_len,
        n_gpus=n_gpus,
        dtype=dtype,
        seed=seed,
        extra_sampling={"peft_config": lora} if lora else None,
        job_type=JobType(job_type),
        source_checkpoint_info=source_checkpoint_info,
    )


def journey_sub_jobs(
    model: str,
    *,
    max_seq_len: int,
    n_gpus: int = 1,
    dtype: str = "float32",
    seed: int = 0,
    learning_rate: float,
    batch_size: int,
    training: dict[str, Any] | None = None,
    weight_decay: float = 0.0,
    mirror_lora: bool = True,
    teacher: str | None = None,
) -> list:
    """The one builder every journey uses: a trainer and a sampler on ``model`` sharing
    ``max_seq_len``, ``n_gpus``, ``dtype`` and ``seed``; a LoRA ``training.peft_config`` is
    mirrored on the sampler (unless ``mirror_lora=False``: a sampler that loads merged
    checkpoints); ``teacher`` adds a frozen ``log_probability`` sub-job on that model, after
    the sampler, because the SDK checks prompt lengths against the first inference_config."""
    common = {"max_seq_len": max_seq_len, "n_gpus": n_gpus, "dtype": dtype, "seed": seed}
    lora = (training or {}).get("peft_config") if mirror_lora else None
    jobs = [
        trainer_sub_job(
            model, learning_rate=learning_rate, batch_size=batch_size, training=training,
            weight_decay=weight_decay, **common,
        ),
        sampler_sub_job(model, lora=lora, **common),
    ]  # fmt: skip
    if teacher is not None:
        jobs.append(sampler_sub_job(teacher, job_type="log_probability", **common))
    return jobs
