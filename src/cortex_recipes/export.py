"""``cortex-recipes export``: a run's checkpoint -> a directory ``from_pretrained`` loads.

A checkpoint is found from a run folder (its ``checkpoints.jsonl``, newest record unless a
``checkpoint_id`` is given, looked up under ``<run>/backend/jobs/*/checkpoints/``) or given
as the checkpoint directory itself (``.../cp_<id>/global_step<N>/`` with its ``meta.json``).
Two layouts are read:

- a standard directory: Hugging Face (``config.json`` + ``model.safetensors`` + tokenizer)
  for full weights, PEFT (``adapter_config.json`` + ``adapter_model.safetensors``) for LoRA;
  it is copied as it is;
- the bare layout (``model.safetensors`` or ``adapter.safetensors`` + ``meta.json``, no
  config): the base model named by ``meta.json`` ``model_name`` is loaded through
  :func:`cortex_recipes.models.resolve_model_path`, the weights are put into it, and it is
  written with ``save_pretrained`` (config, safetensors, tokenizer).

``merge_lora`` folds a LoRA adapter into the base weights and writes a plain model. Nothing
is unpickled: weights are safetensors, metadata is JSON. ``export.json`` in the output
records where it came from. An adapter's ``adapter_config.json`` names its base model as the
run named it (``meta.json`` ``model_name``: a Hub name, or a fixture name that
``resolve_model_path`` builds), never a cache path of this machine.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

META = "meta.json"
BARE_FULL, BARE_ADAPTER = "model.safetensors", "adapter.safetensors"
PEFT_CONFIG, PEFT_WEIGHTS = "adapter_config.json", "adapter_model.safetensors"


class ExportError(RuntimeError):
    """A checkpoint that cannot be exported; the message names the path and what is missing."""


def find_checkpoint(source: Path, checkpoint_id: str | None = None) -> Path:
    """The checkpoint directory ``source`` names (a run folder or a checkpoint directory)."""
    source = Path(source)
    if (source / META).is_file():
        return source
    records_path = source / "checkpoints.jsonl"
    if not records_path.is_file():
        raise ExportError(
            f"{source} is neither a checkpoint directory (no {META}) nor a run folder "
            "(no checkpoints.jsonl)"
        )
    records = [json.loads(x) for x in records_path.read_text().splitlines() if x.strip()]
    if checkpoint_id is not None:
        records = [r for r in records if r.get("checkpoint_id") == checkpoint_id]
    if not records:
        wanted = f" with checkpoint_id={checkpoint_id!r}" if checkpoint_id else ""
        raise ExportError(f"{records_path} records no checkpoint{wanted}")
    record = records[-1]
    found = sorted(
        (source / "backend" / "jobs").glob(f"*/checkpoints/{record['checkpoint_id']}/global_step*")
    )
    found = [d for d in found if (d / META).is_file()]
    if found:
        return found[-1]
    stage = Path(str(record.get("stage_path", "")).rstrip("/"))
    if stage.name and (stage / META).is_file():
        return stage
    raise ExportError(
        f"{source}: checkpoint {record['checkpoint_id']} (stage_path "
        f"{record.get('stage_path')!r}) is not on this machine; a hosted run's checkpoints "
        "live in the service's stage"
    )


def export_checkpoint(
    source: Path, out: Path, *, merge_lora: bool = False, checkpoint_id: str | None = None
) -> dict[str, Any]:
    """Write the checkpoint ``source`` names to ``out``; return what ``export.json`` records."""
    from cortex_recipes.local.checkpoints import MANIFEST, CheckpointCorrupt, verify

    directory = find_checkpoint(source, checkpoint_id)
    try:
        meta = verify(directory)  # every file against the manifest, before anything is written
    except CheckpointCorrupt as exc:
        raise ExportError(str(exc)) from None
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise ExportError(f"{out} exists and is not empty; choose a new directory")
    out.mkdir(parents=True, exist_ok=True)
    lora = bool(meta.get("lora")) or (directory / PEFT_CONFIG).is_file()
    standard = (directory / ("adapter_config.json" if lora else "config.json")).is_file()
    if standard and not (lora and merge_lora):
        for item in directory.iterdir():
            if item.is_file() and item.name not in (META, MANIFEST) and item.suffix != ".dssst1":
                shutil.copy2(item, out / item.name)
        kind = "peft-adapter" if lora else "hf-model"
    else:
        model, tokenizer = _materialise(directory, meta, lora)
        if lora and merge_lora:
            model = model.merge_and_unload()
        model.save_pretrained(out)
        tokenizer.save_pretrained(out)
        kind = "peft-adapter" if lora and not merge_lora else "hf-model"
    if kind == "peft-adapter":
        _name_the_base(out / "adapter_config.json", meta.get("model_name"))
    record = {
        "source": str(directory),
        "checkpoint_id": meta.get("checkpoint_id"),
        "global_steps": meta.get("global_steps"),
        "model_name": meta.get("model_name"),
        "lora": meta.get("lora"),
        "merged": bool(lora and merge_lora),
        "kind": kind,
    }
    (out / "export.json").write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    log.info("exported %s to %s as %s", directory, out, kind)
    return record


def _name_the_base(config_path: Path, model_name: str | None) -> None:
    """An exported adapter names its base model as the run named it (a Hugging Face Hub name,
    or one of this project's offline fixtures, which ``resolve_model_path`` builds), not the
    directory it happened to be loaded from on this machine: the adapter stays loadable where
    that path does not exist."""
    if not model_name or not config_path.is_file():
        return
    config = json.loads(config_path.read_text())
    config["base_model_name_or_path"] = model_name
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def _materialise(directory: Path, meta: dict[str, Any], lora: bool):
    """The base model of ``meta['model_name']`` with the checkpoint's weights in it."""
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from cortex_recipes.models import resolve_model_path

    if not meta.get("model_name"):
        raise ExportError(f"{directory / META}: model_name is missing; cannot find the base model")
    base_dir = resolve_model_path(meta["model_name"])
    model = AutoModelForCausalLM.from_pretrained(
        base_dir, dtype=torch.float32, local_files_only=True
    )
    tokenizer = AutoTokenizer.from_pretrained(base_dir, local_files_only=True)
    if lora:
        from peft import LoraConfig, PeftModel, get_peft_model, set_peft_model_state_dict

        if (directory / PEFT_CONFIG).is_file():
            model = PeftModel.from_pretrained(model, directory)
        else:
            if not (directory / BARE_ADAPTER).is_file():
                raise ExportError(f"{directory}: no {BARE_ADAPTER} or {PEFT_CONFIG}")
            model = get_peft_model(
                model, LoraConfig(task_type="CAUSAL_LM", bias="none", **meta["lora"])
            )
            result = set_peft_model_state_dict(model, load_file(str(directory / BARE_ADAPTER)))
            if getattr(result, "unexpected_keys", None):
                raise ExportError(
                    f"{directory / BARE_ADAPTER}: keys the adapter does not have: "
                    f"{result.unexpected_keys[:5]}"
                )
        model.peft_config["default"].base_model_name_or_path = str(base_dir)
        return model, tokenizer
    weights = directory / BARE_FULL
    if not weights.is_file():
        raise ExportError(f"{directory}: no {BARE_FULL}")
    missing, unexpected = model.load_state_dict(load_file(str(weights)), strict=False)
    tied = getattr(model.config, "tie_word_embeddings", False)
    missing = [k for k in missing if not (tied and k == "lm_head.weight")]
    if missing or unexpected:
        raise ExportError(
            f"{weights} does not match {meta['model_name']}: missing={missing[:5]} "
            f"unexpected={unexpected[:5]}"
        )
    return model, tokenizer
