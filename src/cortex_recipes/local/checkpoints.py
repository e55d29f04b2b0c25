"""Checkpoints and weight files of the local backend: the on-disk layout and the server's store.

Layout of one checkpoint: ``<state>/jobs/<job>/checkpoints/cp_<32 hex>/global_step<N>/``, a
directory that standard tools load as it is:
- full weights: a Hugging Face model directory (``config.json``, ``model.safetensors``,
  ``generation_config.json`` when the model has one, tokenizer files), loadable with
  ``AutoModelForCausalLM.from_pretrained``;
- LoRA: a PEFT adapter directory (``adapter_config.json``, ``adapter_model.safetensors``,
  tokenizer files), loadable with ``PeftModel.from_pretrained(base, dir)``;
- always ``meta.json`` (id, type, global steps, model name, LoRA config) and, for resumable
  checkpoints, ``optimizer.dssst1`` and ``rng.dssst1``;
- ``manifest.json``, written last and atomically: every other file's name, size and sha256.
Only safetensors and JSON are written or read: nothing is ever pickled. A checkpoint is staged
in a temporary directory and renamed into place, so a listed checkpoint is always complete.
Every load verifies the manifest first (:func:`verify`): a missing, truncated or altered file,
or a resumable checkpoint without its optimizer or RNG state, is refused with an error naming
the checkpoint, the file and what differs. A checkpoint written before manifests is checked for
the files its type needs and loaded with a warning that its contents are unverified.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from cortex_training import wire
from safetensors.torch import load_file, save_file

from cortex_recipes.local.errors import DISK_FULL, BackendError, Conflict, NotFound, is_disk_full

log = logging.getLogger(__name__)

META = "meta.json"
MANIFEST = "manifest.json"
FULL_WEIGHTS = "model.safetensors"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
# Checkpoints written before the PEFT layout named the adapter file this; still readable.
LEGACY_ADAPTER_WEIGHTS = "adapter.safetensors"
OPTIMIZER_STATE = "optimizer.dssst1"
RNG_STATE = "rng.dssst1"


# -- weights ------------------------------------------------------------------------------------


def base_model(model):
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def _host_copy(tensor: torch.Tensor) -> torch.Tensor:
    """A CPU tensor that shares nothing with the model (a GPU tensor is copied once)."""
    tensor = tensor.detach()
    return tensor.cpu() if tensor.device.type != "cpu" else tensor.clone()


def full_state_dict(model) -> dict[str, torch.Tensor]:
    """Plain (merged) weights of ``model`` on the CPU; LoRA deltas are folded in without
    mutating the model."""
    from peft import PeftModel

    if not isinstance(model, PeftModel):
        return {k: _host_copy(v) for k, v in model.state_dict().items()}
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
        tensor = value.detach()
        if plain in deltas:
            tensor = tensor + deltas[plain].to(tensor.dtype)
        out[plain] = _host_copy(tensor)
    return out


def _dedupe_tied(state: dict[str, torch.Tensor], model) -> dict[str, torch.Tensor]:
    config = getattr(model, "config", None)
    if getattr(config, "tie_word_embeddings", False):
        state = {k: v for k, v in state.items() if k != "lm_head.weight"}
    return {k: v.contiguous() for k, v in state.items()}


def save_full_weights(model, path: Path) -> None:
    save_file(_dedupe_tied(full_state_dict(model), base_model(model)), str(path))


def _device_of(model) -> str:
    return str(next(model.parameters()).device)


def load_full_weights(model, path: Path) -> None:
    """Load plain weights into a plain (non-LoRA) model; tied weights may be absent."""
    if hasattr(model, "peft_config"):
        raise ValueError(
            "full weights cannot be loaded into a LoRA sub-job; sync with weight_format='lora'"
        )
    state = load_file(str(path), device=_device_of(model))
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
    save_file({k: _host_copy(v).contiguous() for k, v in state.items()}, str(path))


def load_adapter(model, path: Path) -> None:
    from peft import set_peft_model_state_dict

    if not hasattr(model, "peft_config"):
        raise ValueError("LoRA weights need a sub-job created with a peft_config")
    result = set_peft_model_state_dict(model, load_file(str(path), device=_device_of(model)))
    unexpected = getattr(result, "unexpected_keys", [])
    if unexpected:
        raise ValueError(f"LoRA weights do not match the adapter: unexpected={unexpected[:5]}")


def adapter_file(directory: Path) -> Path:
    path = directory / ADAPTER_WEIGHTS
    return path if path.exists() else directory / LEGACY_ADAPTER_WEIGHTS


# -- optimizer and RNG ------------------------------------------------------------------------------


def save_optimizer(optimizer: torch.optim.Optimizer, path: Path) -> None:
    state = optimizer.state_dict()
    encoded = {
        "state": {
            str(k): {name: _host_copy(v) if torch.is_tensor(v) else v for name, v in s.items()}
            for k, s in state["state"].items()
        },
        "param_groups": state["param_groups"],
    }
    path.write_bytes(wire.dumps(encoded))


def load_optimizer(optimizer: torch.optim.Optimizer, path: Path) -> None:
    """Load AdamW state; ``load_state_dict`` moves each tensor to its parameter's device."""
    decoded = wire.loads(path.read_bytes())
    state = {int(k): v for k, v in decoded["state"].items()}
    optimizer.load_state_dict({"state": state, "param_groups": decoded["param_groups"]})


def rng_state(device: torch.device) -> dict[str, torch.Tensor]:
    state = {"torch": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def restore_rng(state: dict[str, torch.Tensor], device: torch.device) -> None:
    torch.set_rng_state(state["torch"])
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)


# -- one checkpoint directory ------------------------------------------------------------------------


def free_bytes(path: Path) -> int | None:
    """Bytes free on the file system holding ``path`` (or its nearest existing parent)."""
    path = Path(path)
    while not path.exists() and path != path.parent:
        path = path.parent
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return None


def write_checkpoint(
    directory: Path,
    *,
    model,
    tokenizer,
    meta: dict[str, Any],
    optimizer: torch.optim.Optimizer | None = None,
    device: torch.device | None = None,
) -> None:
    """Write a complete checkpoint into the empty ``directory`` (the caller publishes it, or
    discards it when this raises). A full disk is a BackendError that says so
    (:data:`~cortex_recipes.local.errors.DISK_FULL`), with the folder and the bytes free."""
    try:
        if meta.get("lora"):
            save_adapter(model, directory / ADAPTER_WEIGHTS)
            model.peft_config["default"].save_pretrained(str(directory))
        else:
            save_full_weights(model, directory / FULL_WEIGHTS)
            plain = base_model(model)
            plain.config.save_pretrained(str(directory))
            generation = getattr(plain, "generation_config", None)
            if generation is not None:
                generation.save_pretrained(str(directory))
        tokenizer.save_pretrained(str(directory))
        if optimizer is not None:
            save_optimizer(optimizer, directory / OPTIMIZER_STATE)
            rng = rng_state(device or torch.device("cpu"))
            (directory / RNG_STATE).write_bytes(wire.dumps(rng))
        write_meta(directory, meta)
        write_manifest(directory)
    except Exception as exc:
        if not is_disk_full(exc):
            raise
        raise BackendError(
            f"{DISK_FULL} while saving checkpoint {meta.get('checkpoint_id')} into {directory} "
            f"({free_bytes(directory)} bytes free there): this checkpoint is not kept, every "
            "earlier one is intact",
            status=507,
            code="disk_full",
        ) from exc


# -- the manifest ---------------------------------------------------------------------------------


class CheckpointCorrupt(BackendError):
    """A checkpoint whose files do not match its manifest (or lack what its type needs)."""

    status = 409
    code = "checkpoint_corrupt"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_manifest(directory: Path) -> None:
    """Record every file of ``directory`` (size and sha256), last and atomically."""
    files = {
        path.name: {"bytes": path.stat().st_size, "sha256": _sha256(path)}
        for path in sorted(directory.iterdir())
        if path.is_file() and path.name != MANIFEST and not path.name.startswith(".")
    }
    tmp = directory / f".{MANIFEST}.tmp"
    tmp.write_text(json.dumps({"version": 1, "files": files}, indent=2, sort_keys=True))
    os.replace(tmp, directory / MANIFEST)


def _required_files(meta: dict[str, Any]) -> list[str]:
    weights = ADAPTER_WEIGHTS if meta.get("lora") else FULL_WEIGHTS
    resumable = meta.get("checkpoint_type") == "resumable"
    return [META, weights] + ([OPTIMIZER_STATE, RNG_STATE] if resumable else [])


def verify(directory: Path) -> dict[str, Any]:
    """The checkpoint's meta, once every file matches its manifest; else CheckpointCorrupt
    naming the checkpoint, the file and what differs."""
    directory = Path(directory)
    where = f"checkpoint {directory.parent.name}/{directory.name}"
    try:
        meta = read_meta(directory)
    except FileNotFoundError:
        raise CheckpointCorrupt(f"{where}: {META} is missing") from None
    except ValueError as exc:
        raise CheckpointCorrupt(f"{where}: {META} is not valid JSON ({exc})") from None
    where = f"checkpoint {meta.get('checkpoint_id', directory.parent.name)} ({directory})"
    manifest_path = directory / MANIFEST
    if not manifest_path.is_file():
        required = _required_files(meta)
        if meta.get("lora") and not (directory / ADAPTER_WEIGHTS).is_file():
            required = [LEGACY_ADAPTER_WEIGHTS if n == ADAPTER_WEIGHTS else n for n in required]
        missing = [name for name in required if not (directory / name).is_file()]
        if missing:
            raise CheckpointCorrupt(
                f"{where}: {', '.join(missing)} missing (a {meta.get('checkpoint_type')} "
                "checkpoint needs them)"
            )
        log.warning(
            "%s has no %s (written before manifests): its files are unverified", where, MANIFEST
        )
        return meta
    try:
        files = json.loads(manifest_path.read_text())["files"]
    except (ValueError, KeyError, TypeError) as exc:
        raise CheckpointCorrupt(f"{where}: {MANIFEST} is unreadable ({exc})") from None
    for name in _required_files(meta):
        if name not in files:
            raise CheckpointCorrupt(f"{where}: its manifest does not list {name}")
    for name, expected in sorted(files.items()):
        path = directory / name
        if not path.is_file():
            raise CheckpointCorrupt(f"{where}: {name} is missing")
        size = path.stat().st_size
        if size != expected.get("bytes"):
            raise CheckpointCorrupt(
                f"{where}: {name} is {size} bytes, the manifest says {expected.get('bytes')}"
                + (" (truncated)" if size < expected.get("bytes", 0) else "")
            )
        if _sha256(path) != expected.get("sha256"):
            raise CheckpointCorrupt(
                f"{where}: {name} has been altered (its sha256 differs from the manifest's)"
            )
    return meta


def write_meta(directory: Path, meta: dict[str, Any]) -> None:
    (directory / META).write_text(json.dumps(meta, indent=2, sort_keys=True))


def read_meta(directory: Path) -> dict[str, Any]:
    return json.loads((directory / META).read_text())


def atomic_publish(tmp: Path, final: Path) -> None:
    final.parent.mkdir(parents=True, exist_ok=True)
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)


# -- the server's store --------------------------------------------------------------------------------


class CheckpointStore:
    """Where each job's checkpoints live under the state directory; ids are checked by the
    caller (:mod:`cortex_recipes.local.bodies`) before they reach a path."""

    def __init__(self, state_dir: Path):
        self.state_dir = Path(state_dir)

    def root(self, job_id: str, checkpoint_id: str) -> Path:
        return self.state_dir / "jobs" / job_id / "checkpoints" / checkpoint_id

    def exists(self, job_id: str, checkpoint_id: str) -> bool:
        return self.root(job_id, checkpoint_id).exists()

    def directory(self, job_id: str, checkpoint_id: str) -> Path:
        """The newest complete ``global_step<N>`` directory of a checkpoint."""
        steps = sorted(self.root(job_id, checkpoint_id).glob(f"global_step*/{META}"))
        if not steps:
            raise NotFound(f"checkpoint {checkpoint_id} not found in job {job_id}")
        return steps[-1].parent

    def reserve(self, job_id: str, checkpoint_id: str) -> Path:
        """A fresh staging directory for a new checkpoint; 409 if the id is taken."""
        root = self.root(job_id, checkpoint_id)
        root.parent.mkdir(parents=True, exist_ok=True)
        try:
            root.mkdir()
        except FileExistsError as exc:
            raise Conflict(
                f"checkpoint_id={checkpoint_id!r} already exists in job {job_id}; "
                "pick a new id or omit it",
                code="checkpoint_exists",
            ) from exc
        return Path(tempfile.mkdtemp(prefix=".staging-", dir=root))

    def publish(self, staging: Path, global_steps: int) -> Path:
        final = staging.parent / f"global_step{global_steps}"
        atomic_publish(staging, final)
        return final

    def discard(self, job_id: str, checkpoint_id: str) -> None:
        shutil.rmtree(self.root(job_id, checkpoint_id), ignore_errors=True)

    def list(self, job_id: str) -> list[dict[str, Any]]:
        out = []
        checkpoints = self.state_dir / "jobs" / job_id / "checkpoints"
        for meta_path in sorted(checkpoints.glob(f"cp_*/global_step*/{META}")):
            meta = read_meta(meta_path.parent)
            out.append(
                {
                    "checkpoint_id": meta["checkpoint_id"],
                    "checkpoint_type": meta["checkpoint_type"],
                    "global_steps": meta["global_steps"],
                    "created_at": meta["created_at"],
                    "stage_path": f"{meta_path.parent.as_posix()}/",
                }
            )
        return sorted(out, key=lambda c: c["created_at"])

    def delete(self, job_id: str, checkpoint_id: str) -> None:
        shutil.rmtree(self.directory(job_id, checkpoint_id).parent)
