"""Every checked-in SFT profile parses, builds SDK sub-jobs and submits causal_cross_entropy."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cortex_training import wire

from cortex_recipes import frames, sft
from cortex_recipes.profiles import ProfileError
from cortex_recipes.supervision import collate

pytestmark = pytest.mark.contract

CONFIGS = sorted(
    Path(__file__).resolve().parents[2].glob("recipes/sft/conversational/configs/*.json")
)


def test_there_are_cpu_gpu_and_cortex_profiles():
    names = {p.stem for p in CONFIGS}
    assert {"local-cpu-tiny-qwen3", "local-cpu-smollm2-lora", "local-cpu-smollm2-full"} <= names
    assert {"local-gpu-qwen3-0.6b", "cortex-qwen3-8b-lora", "cortex-qwen3-8b-full"} <= names


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_profile_resolves_to_the_causal_cross_entropy_block(path):
    profile = sft.load_profile(path)
    assert profile.dataset_path.is_file()
    sub_job = profile.training_sub_job()
    sub_job.validate()  # the SDK's own typed validation
    wire_config = sub_job.to_wire()["training_config"]
    ds = wire_config.get("ds_config", {})
    assert not set(ds) & set(sft.DS_BATCH_FIELDS)
    training, sampling = profile.sub_jobs()
    assert training.to_wire() == sub_job.to_wire()
    sampling.validate()
    # the sampler mirrors a LoRA trainer's adapter, so the last eval's sync sends only that
    lora = (profile.training or {}).get("peft_config")
    assert profile.weight_format == ("lora" if lora else "hf")
    assert sampling.to_wire()["inference_config"].get("peft_config") == lora
    batch = collate([frames.Row([1, 2, 3], [0.0, 1.0, 1.0])], pad_id=0, max_seq_len=8)
    frame = wire.loads(frames.sft_frame(batch))
    # The loss block is the same with or without the chunked LM-head memory knob.
    assert frame["processing"] == {
        "loss_fn": "causal_cross_entropy",
        "post": ["compute_logprobs"],
        "config": {},
    }
    assert "labels" not in frame["kwargs"]


def test_chunk_knob_is_passed_through_not_turned_into_a_loss_choice():
    path = next(p for p in CONFIGS if p.stem == "cortex-qwen3-8b-full")
    wire_config = sft.load_profile(path).training_sub_job().to_wire()["training_config"]
    assert wire_config["prime_rl"]["fused_lm_head_token_chunk_size"] == 8192


def _profile_with(tmp_path, **changes) -> Path:
    raw = json.loads(next(p for p in CONFIGS if p.stem == "local-cpu-tiny-qwen3").read_text())
    raw.update(changes)
    (tmp_path / "configs").mkdir(exist_ok=True)
    path = tmp_path / "configs" / "p.json"
    path.write_text(json.dumps(raw))
    return path


@pytest.mark.parametrize("field", sft.DS_BATCH_FIELDS)
def test_a_profile_that_sets_a_deepspeed_batch_field_is_rejected_with_the_reason(tmp_path, field):
    with pytest.raises(ProfileError, match=rf"training.ds_config sets \['{field}'\]; remove"):
        sft.load_profile(_profile_with(tmp_path, training={"ds_config": {field: 4}}))


def test_batch_size_is_global_and_sent_as_the_rows_of_a_step():
    path = next(p for p in CONFIGS if p.stem == "cortex-qwen3-8b-lora")
    profile = sft.load_profile(path)
    assert (profile.batch_size, profile.n_gpus) == (16, 8)
    sub_job = profile.training_sub_job()
    sub_job.validate()
    wire_job = sub_job.to_wire()
    assert wire_job["global_batch_size"] == 16
    # rows per optimiser step, as the SDK's recipes read it; the service shards them per rank
    assert wire_job["training_config"]["train_batch_size"] == 16
    with pytest.raises(ProfileError, match="batch_size=15 is the global batch"):
        sft.load_profile(path, ["batch_size=15"])


def test_bad_profile_fields_are_named(tmp_path):
    with pytest.raises(ProfileError, match="train_on='everything'"):
        sft.load_profile(_profile_with(tmp_path, train_on="everything"))
    with pytest.raises(ProfileError, match=r"unknown keys \['lr'\]"):
        sft.load_profile(_profile_with(tmp_path, lr=1))


def test_batches_are_seeded_epochs():
    first = sft.batches(5, 4, 3, seed=0)
    assert first == sft.batches(5, 4, 3, seed=0) != sft.batches(5, 4, 3, seed=1)
    flat = [i for b in first for i in b]
    assert sorted(flat[:5]) == list(range(5))
