"""A full disk (issue 47, item 3): a checkpoint save that runs out of space says so, with the
folder and the bytes free, keeps nothing of itself and leaves every earlier checkpoint; the
journey's command reports it in one line with what the run kept, no traceback; a record line
is written whole or not at all. Space is exhausted for real: the write goes to /dev/full, which
fails every write with ENOSPC, as a full file system does."""

from __future__ import annotations

import errno
import json
import os

import pytest

from cortex_recipes import run as run_module
from cortex_recipes.run import open_run

pytestmark = [
    pytest.mark.unit,
    pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs Linux's /dev/full"),
]


def test_a_checkpoint_save_on_a_full_disk_says_so_and_names_the_folder(tmp_path):
    import torch

    from cortex_recipes.local import checkpoints
    from cortex_recipes.local.errors import DISK_FULL, BackendError
    from cortex_recipes.models import load_causal_lm, load_tokenizer

    model, tokenizer = load_causal_lm("tiny-qwen3"), load_tokenizer("tiny-qwen3")
    directory = tmp_path / "cp_full" / "global_step1"
    directory.mkdir(parents=True)
    (directory / "config.json").symlink_to("/dev/full")  # the disk fills after the weights
    meta = {"checkpoint_id": "cp_full", "checkpoint_type": "weights-only", "lora": None}
    with pytest.raises(BackendError) as err:
        checkpoints.write_checkpoint(
            directory, model=model, tokenizer=tokenizer, meta=meta, device=torch.device("cpu")
        )
    message = str(err.value)
    assert message.startswith(f"{DISK_FULL} while saving checkpoint cp_full into {directory}")
    assert "bytes free there" in message and "every earlier one is intact" in message
    assert err.value.status == 507 and err.value.code == "disk_full"
    assert not (directory / checkpoints.MANIFEST).exists()  # never looks complete


def test_other_save_errors_stay_what_they_are():
    from cortex_recipes.local.errors import DISK_FULL, is_disk_full

    assert is_disk_full(OSError(errno.ENOSPC, "No space left on device"))
    # the backend's own report, as a journey sees it in a failed request (one predicate for both)
    assert is_disk_full(RuntimeError(f"Request req-1 ended with state 'failed': {DISK_FULL} ..."))
    assert is_disk_full(
        RuntimeError("Error while serializing: IoError(Os { code: 28 ... os error 28")
    )
    assert not is_disk_full(OSError(errno.EACCES, "Permission denied"))
    assert not is_disk_full(ValueError("bad tensor"))


def test_a_record_that_cannot_be_written_leaves_no_half_line(tmp_path):
    run = open_run("sft", _Profile(), {}, log_path=str(tmp_path))
    (tmp_path / "rollouts.jsonl").symlink_to("/dev/full")
    with pytest.raises(OSError) as err:
        run._append("rollouts.jsonl", {"step": 1, "text": "x" * 100})
    assert err.value.errno == errno.ENOSPC


@pytest.mark.parametrize("where", ["backend", "run"])
def test_the_command_reports_a_full_disk_in_one_line_with_what_was_kept(tmp_path, capsys, where):
    from cortex_recipes.local.errors import DISK_FULL

    def main(config):
        run = open_run("sft", _Profile(), {}, log_path=str(tmp_path))
        run._append("metrics.jsonl", {"step": 1})
        run.checkpoints.save(1, {"trainer": {"job_id": "j", "checkpoint_id": "cp_1"}})
        if where == "backend":
            raise RuntimeError(f"save failed: {DISK_FULL} while saving checkpoint cp_2 into x")
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "metrics.jsonl"))

    class Config:
        pass

    original = run_module.profiles.entrypoint
    run_module.profiles.entrypoint = lambda *a: Config()
    try:
        code = run_module.command_line(Config, object, main)
    finally:
        run_module.profiles.entrypoint = original
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert err.startswith("error: ") and len(err.strip().splitlines()) == 1
    assert f"kept in {tmp_path}: records of steps 1-1, resume points [1]" in err
    assert "free space and rerun the same command to resume" in err
    assert json.loads((tmp_path / "metrics.jsonl").read_text()) == {"step": 1}


def test_any_other_error_keeps_its_traceback(tmp_path):
    def main(config):
        raise KeyError("a bug")

    original = run_module.profiles.entrypoint
    run_module.profiles.entrypoint = lambda *a: object()
    try:
        with pytest.raises(KeyError):
            run_module.command_line(object, object, main)
    finally:
        run_module.profiles.entrypoint = original


class _Profile:
    name = "p"
    config_hash = "hash-a"
    raw: dict = {"name": "p"}
