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
            block = _block(wire, "training_config", "inference_config", _TRAINING_REQUIRED, where)
            sub_job = SubJobConfig.training_job(
                model_name,
                **{key: block.pop(key) for key in _TRAINING_REQUIRED},
                **{key: block.pop(key) for key in _TRAINING_OPTIONAL if key in block},
                extra_training=block or None,
                **common,
            )
        else:
            block = _block(wire, "inference_config", "training_config", _INFERENCE_REQUIRED, where)
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


def _block(
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


def trainer_and_sampler(
    raw: dict[str, Any], *, model: str, learning_rate: float, batch_size: int, training: Any
) -> list:
    """A training sub-job and a sampling sub-job on ``model``, sharing ``raw``'s
    ``max_seq_len``, ``n_gpus``, ``dtype`` and ``seed``; a LoRA ``training.peft_config`` is
    given to the sampler too, so LoRA weight sync has somewhere to land."""
    from cortex_training import SubJobConfig

    common = {
        "max_seq_len": raw["max_seq_len"],
        "n_gpus": raw.get("n_gpus", 1),
        "dtype": raw.get("dtype", "float32"),
        "seed": raw.get("seed", 0),
    }
    training = dict(training or {})
    lora = training.get("peft_config")
    return [
        SubJobConfig.training_job(
            model,
            optimizer={"name": "AdamW", "lr": learning_rate, "weight_decay": 0.0},
            train_batch_size=batch_size,
            extra_training=training or None,
            **common,
        ),
        SubJobConfig.sampling_job(
            model, extra_sampling={"peft_config": lora} if lora else None, **common
        ),
    ]
