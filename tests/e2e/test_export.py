"""`cortex-recipes export`: a local-backend checkpoint -> a directory Hugging Face and PEFT
load, whose greedy output is the backend's own for the same prompt (tiny-qwen3)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from cortex_recipes import cli
from cortex_recipes.export import ExportError, export_checkpoint
from cortex_recipes.frames import Row, sft_frame
from cortex_recipes.models import resolve_model_path
from cortex_recipes.supervision import collate

from .conftest import TINY, inference, start, training

pytestmark = pytest.mark.e2e

LORA = {"r": 8, "lora_alpha": 16, "target_modules": ["q_proj", "v_proj"]}
PROMPT = [9707, 11, 1246, 525, 498, 30]
NEW_TOKENS = 8


def trained_checkpoint(client, lora=None) -> tuple[str, dict]:
    """A few SFT steps at a high learning rate (so the weights move), then a weights-only
    save; returns the job id and the save result."""
    job_id = start(client, [training(lora=lora, lr=5e-2)])
    rows = [Row([11, 12, 13, 14, 15, 16], [0, 1, 1, 1, 1, 1])] * 2
    frame = sft_frame(collate(rows, pad_id=0, max_seq_len=32))
    for _ in range(3):
        client.poll_request(job_id, client.forward_backward(job_id, frame))
        client.poll_request(job_id, client.step(job_id))
    saved = client.poll_request(job_id, client.save(job_id, checkpoint_type="weights-only"))
    client.cancel_job(job_id)
    return job_id, saved


def backend_greedy(client, job_id: str, saved: dict, lora=None) -> list[int]:
    source = {"checkpoint_id": saved["checkpoint_id"], "source_job_id": job_id}
    sampler = start(client, [inference(source=source, lora=lora)])
    request = client.generate(sampler, [PROMPT], {"max_tokens": NEW_TOKENS, "temperature": 0.0})
    tokens = client.poll_request(sampler, request)["results"][0]["token_ids"]
    client.cancel_job(sampler)
    return list(tokens)


def hf_greedy(model) -> list[int]:
    model.eval()
    with torch.no_grad():
        out = model.generate(
            torch.tensor([PROMPT]), max_new_tokens=NEW_TOKENS, do_sample=False, num_beams=1
        )
    return out[0, len(PROMPT) :].tolist()


def stage_dir(saved: dict) -> Path:
    return Path(saved["stage_path"].rstrip("/"))


def test_full_weights_export_loads_with_from_pretrained_and_greedy_matches_the_backend(
    client, tmp_path
):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    job_id, saved = trained_checkpoint(client)
    expected = backend_greedy(client, job_id, saved)
    out = tmp_path / "export"
    assert cli.main(["export", str(stage_dir(saved)), str(out)]) == 0
    model = AutoModelForCausalLM.from_pretrained(out, local_files_only=True)
    assert hf_greedy(model) == expected
    base = AutoModelForCausalLM.from_pretrained(resolve_model_path(TINY), local_files_only=True)
    assert hf_greedy(base) != expected  # the export carries the trained weights
    AutoTokenizer.from_pretrained(out, local_files_only=True)
    record = json.loads((out / "export.json").read_text())
    assert record["kind"] == "hf-model" and record["model_name"] == TINY


def test_lora_export_loads_with_peft_and_merged_export_with_from_pretrained(client, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    job_id, saved = trained_checkpoint(client, lora=LORA)
    expected = backend_greedy(client, job_id, saved)  # a plain sampler: merged on load
    adapter_out, merged_out = tmp_path / "adapter", tmp_path / "merged"
    export_checkpoint(stage_dir(saved), adapter_out)
    assert (adapter_out / "adapter_config.json").is_file()
    # the base model as the run named it, not this machine's cache path
    config = json.loads((adapter_out / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == TINY
    base = AutoModelForCausalLM.from_pretrained(resolve_model_path(TINY), local_files_only=True)
    assert hf_greedy(PeftModel.from_pretrained(base, adapter_out)) == expected
    assert cli.main(["export", str(stage_dir(saved)), str(merged_out), "--merge-lora"]) == 0
    merged = AutoModelForCausalLM.from_pretrained(merged_out, local_files_only=True)
    assert hf_greedy(merged) == expected
    assert json.loads((merged_out / "export.json").read_text())["merged"] is True


def test_export_finds_the_newest_checkpoint_of_a_run_folder(client, tmp_path):
    job_id, saved = trained_checkpoint(client)
    run = tmp_path / "run"
    backend_copy = run / "backend" / "jobs" / job_id / "checkpoints" / saved["checkpoint_id"]
    backend_copy.parent.mkdir(parents=True)
    import shutil

    shutil.copytree(stage_dir(saved).parent, backend_copy)
    (run / "checkpoints.jsonl").write_text(
        json.dumps({"step": 3, "checkpoint_id": saved["checkpoint_id"], "stage_path": "gone/"})
        + "\n"
    )
    record = export_checkpoint(run, tmp_path / "out")
    assert record["checkpoint_id"] == saved["checkpoint_id"]
    with pytest.raises(ExportError, match="not empty"):
        export_checkpoint(run, tmp_path / "out")
    with pytest.raises(ExportError, match="records no checkpoint with checkpoint_id='cp_x'"):
        export_checkpoint(run, tmp_path / "other", checkpoint_id="cp_x")
