"""Checkpoint and weight files of the local backend: safetensors and JSON only, never pickle."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch
from cortex_training import wire
from safetensors.torch import load_file, save_file

META = "meta.json"
FULL_WEIGHTS = "model.safetensors"
ADAPTER_WEIGHTS = "adapter.safetensors"
OPTIMIZER_STATE = "optimizer.dssst1"


def lora_module_names(model) -> list[str]:
    return [name for name, module in model.named_modules() if hasattr(module, "lora_A")]


def full_state_dict(model) -> dict[str, torch.Tensor]:
    """Plain (merged) weights of ``model``; LoRA deltas are folded in without mutating it."""
    from peft import PeftModel

    if not isinstance(model, PeftModel):
        return {k: v.detach().clone() for k, v in model.state_dict().items()}
    base = model.get_base_model()
    deltas = {}
    for name, module in base.named_modules():
        if hasattr(module, "lora_A") and "default" in module.lora_A:
            deltas[f"{name}.weight"] = module.get_delta_weight("default").detach()
    out: dict[str, torch.Tensor] = {}
    for key, value in base.state_dict().items():
        if ".lora_" in key:
            continue
        plain = key.replace(".base_layer.", ".")
        tensor = value.detach().clone()
        if plain in deltas:
            tensor = tensor + deltas[plain].to(tensor.dtype)
        out[plain] = tensor
    return out


def _dedupe_tied(state: dict[str, torch.Tensor], model) -> dict[str, torch.Tensor]:
    config = getattr(model, "config", None)
    if getattr(config, "tie_word_embeddings", False):
        state = {k: v for k, v in state.items() if k != "lm_head.weight"}
    return {k: v.contiguous() for k, v in state.items()}


def save_full_weights(model, path: Path) -> None:
    save_file(_dedupe_tied(full_state_dict(model), base_model(model)), str(path))


def base_model(model):
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def load_full_weights(model, path: Path) -> None:
    """Load plain weights into a plain (non-LoRA) model; tied weights may be absent."""
    if hasattr(model, "peft_config"):
        raise ValueError(
            "full weights cannot be loaded into a LoRA sub-job; sync with weight_format='lora'"
        )
    state = load_file(str(path))
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = getattr(model.config, "tie_word_embeddings", False)
    missing = [k for k in missing if not (tied and k == "lm_head.weight")]
    if missing or unexpected:
        raise ValueError(
            f"weights do not match the model: missing={missing[:5]} unexpected={unexpected[:5]}"
        )


def save_adapter(model, path: Path) -> None:
    from peft import get_peft_model_state_dict

    state = get_peft_model_state_dict(model)
    save_file({k: v.detach().contiguous() for k, v in state.items()}, str(path))


def load_adapter(model, path: Path) -> None:
    from peft import set_peft_model_state_dict

    if not hasattr(model, "peft_config"):
        raise ValueError("LoRA weights need a sub-job created with a peft_config")
    result = set_peft_model_state_dict(model, load_file(str(path)))
    unexpected = getattr(result, "unexpected_keys", [])
    if unexpected:
        raise ValueError(f"LoRA weights do not match the adapter: unexpected={unexpected[:5]}")


def save_optimizer(optimizer: torch.optim.Optimizer, path: Path) -> None:
    state = optimizer.state_dict()
    encoded = {
        "state": {str(k): dict(v) for k, v in state["state"].items()},
        "param_groups": state["param_groups"],
    }
    path.write_bytes(wire.dumps(encoded))


def load_optimizer(optimizer: torch.optim.Optimizer, path: Path) -> None:
    decoded = wire.loads(path.read_bytes())
    state = {int(k): v for k, v in decoded["state"].items()}
    optimizer.load_state_dict({"state": state, "param_groups": decoded["param_groups"]})


def write_meta(directory: Path, meta: dict[str, Any]) -> None:
    (directory / META).write_text(json.dumps(meta, indent=2, sort_keys=True))


def read_meta(directory: Path) -> dict[str, Any]:
    return json.loads((directory / META).read_text())


def atomic_publish(tmp: Path, final: Path) -> None:
    final.parent.mkdir(parents=True, exist_ok=True)
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
