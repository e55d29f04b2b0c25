"""A teacher the SFT journey taught: an SFT run, trained or reused, exported with LoRA merged.

An OPD profile's ``teacher_sft`` names an SFT journey profile
(``recipes/sft/conversational/configs/<name>.json``) whose ``model`` is the OPD profile's
``teacher_model``. :func:`prepare` makes the teacher the OPD run scores with:

1. the SFT run in ``run_dir`` (the OPD run passes ``teacher-sft/`` inside its own folder,
   or the folder its ``teacher_run`` names, e.g. the SFT journey's ``runs/sft/<name>`` to
   reuse the README's first command's run): a finished run is read back, an unfinished one
   resumed, an empty folder trained; a run of another config is refused by the run store;
2. its final checkpoint exported as a plain Hugging Face model (LoRA merged into the base
   weights, :func:`cortex_recipes.export.export_checkpoint`) into
   ``<run_dir>/teacher-<checkpoint_id>/``, reused when it is already there.

The exported folder is a local model directory, so the local backend's teacher sub-job loads
it like any model. A hosted endpoint cannot load a folder on this machine, so ``teacher_sft``
is refused there (export the SFT run and publish it, then name it in ``teacher_model``).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from cortex_recipes.profiles import ProfileError

log = logging.getLogger(__name__)

SFT_JOURNEY = "recipes/sft/conversational"
TEACHER_DIR = "teacher-sft"  # the teacher's SFT run inside an OPD run's folder, by default


class TeacherSFTError(ProfileError):
    """A ``teacher_sft`` that cannot make a teacher; the message names the field and value."""


def sft_configs_dir() -> Path:
    return Path(__file__).resolve().parents[2] / "sft" / "conversational" / "configs"


def sft_profile_path(name: str) -> Path:
    """The SFT profile file ``teacher_sft=name`` names; an unknown name lists the known ones."""
    configs = sft_configs_dir()
    path = configs / f"{name}.json"
    if "/" in name or not path.is_file():
        known = ", ".join(sorted(p.stem for p in configs.glob("*.json")))
        raise TeacherSFTError(
            f"teacher_sft={name!r} is not an SFT profile in {SFT_JOURNEY}/configs; "
            f"accepted: {known}"
        )
    return path


def check(teacher_sft: str, teacher_model: str, connection: str) -> Path:
    """The SFT profile's path, once it is known to train ``teacher_model`` locally."""
    from cortex_recipes import sft

    path = sft_profile_path(teacher_sft)
    model = sft.load_profile(path).model
    if model != teacher_model:
        raise TeacherSFTError(
            f"teacher_sft={teacher_sft!r} trains model={model!r}, but "
            f"teacher_model={teacher_model!r}; the SFT profile must train the teacher model"
        )
    if connection != "local":
        raise TeacherSFTError(
            f"teacher_sft={teacher_sft!r} needs connection='local' (the exported teacher is a "
            "folder on this machine); for a hosted endpoint export the SFT run, publish it and "
            "name it in teacher_model"
        )
    return path


def prepare(
    teacher_sft: str, teacher_model: str, *, connection: str, run_dir: str | Path
) -> dict[str, Any]:
    """Train or reuse the SFT run and export it merged; what the OPD record keeps about it.

    Returns ``model`` (the exported folder, for the teacher sub-job), the SFT profile and
    config hash, the checkpoint, and the SFT run's held-out answers after training."""
    from cortex_recipes.export import export_checkpoint
    from recipes.sft.conversational.train import Config, main

    path = check(teacher_sft, teacher_model, connection)
    # absolute: the teacher sub-job loads the export from wherever the backend runs
    run_dir = Path(run_dir).resolve()
    log.info("teacher: the SFT journey's %s run in %s", teacher_sft, run_dir)
    summary = main(Config(profile=str(path), log_path=str(run_dir), connection=connection))
    checkpoint_id = summary["checkpoint_id"]
    out = run_dir / f"teacher-{checkpoint_id}"
    record_path = out / "export.json"
    if record_path.is_file():
        record = json.loads(record_path.read_text())
        if record.get("checkpoint_id") != checkpoint_id or record.get("kind") != "hf-model":
            raise TeacherSFTError(
                f"teacher_sft={teacher_sft!r}: {out} holds a {record.get('kind')!r} export of "
                f"checkpoint {record.get('checkpoint_id')!r}, not a model of {checkpoint_id!r}; "
                "move it away and rerun"
            )
        log.info("teacher: reusing the merged export in %s", out)
    else:
        record = export_checkpoint(run_dir, out, merge_lora=True, checkpoint_id=checkpoint_id)
    after = summary.get("eval_after") or {}
    return {
        "model": str(out),
        "sft_profile": teacher_sft,
        "sft_config_hash": summary["config_hash"],
        "checkpoint_id": checkpoint_id,
        "merged": record.get("merged"),
        "sft_run_dir": str(run_dir),
        "sft_held_out_hits": after.get("held_out_hits"),
        "sft_held_out_total": after.get("held_out_total"),
    }
