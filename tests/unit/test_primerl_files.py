"""prime-rl's rollout files and weight-version files: decoding, fail-closed errors, the frame.

Files are built with msgpack the way prime-rl writes them (an ``array_like`` MicroBatch per
entry, trailing defaults omitted); recipes/rl/async_grpo/primerl/recorded/ holds files that
prime-rl's own orchestrator wrote in a real run (its README says how they were recorded).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests import extras

pytest.importorskip("msgspec", reason=extras.reason("grpo"))

import msgspec
import torch
from cortex_training import wire

from cortex_recipes.primerl import broadcasts
from cortex_recipes.primerl.rollout_files import (
    FIELDS,
    MicroBatch,
    RolloutFileError,
    read_rows,
)
from cortex_recipes.primerl.trainer import grpo_rows_frame

pytestmark = pytest.mark.unit

DATA = (
    Path(__file__).resolve().parents[2] / "recipes" / "rl" / "async_grpo" / "primerl" / "recorded"
)


def packed(samples: list[dict]) -> MicroBatch:
    """One packed micro-batch of ``samples`` ({ids, mask, adv, lp})."""
    out = {k: [] for k in ("input_ids", "loss_mask", "advantages", "inference_logprobs")}
    positions, lengths = [], []
    for s in samples:
        out["input_ids"] += s["ids"]
        out["loss_mask"] += s["mask"]
        out["advantages"] += s["adv"]
        out["inference_logprobs"] += s["lp"]
        positions += list(range(len(s["ids"])))
        lengths.append(len(s["ids"]))
    n = len(out["input_ids"])
    return MicroBatch(
        **out,
        position_ids=positions,
        sequence_lengths=lengths,
        temperatures=[1.0] * n,
        env_names=["math"] * n,
        seq_lens=list(lengths),
    )


SAMPLES = [
    {"ids": [5, 6, 7, 8], "mask": [False, False, True, True], "adv": [0, 0, 0.5, 0.5],
     "lp": [0, 0, -1.0, -2.0]},
    {"ids": [9, 10, 11], "mask": [False, True, True], "adv": [0, -0.5, -0.5],
     "lp": [0, -3.0, -4.0]},
]  # fmt: skip


def write(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def test_packed_rows_are_split_by_sequence_lengths(tmp_path):
    path = write(tmp_path / "rank_0.bin", msgspec.msgpack.encode([packed(SAMPLES)]))
    rows = read_rows(path)
    assert [r.input_ids for r in rows] == [[5, 6, 7, 8], [9, 10, 11]]
    assert rows[1].loss_mask == [False, True, True]
    assert rows[1].inference_logprobs == [0, -3.0, -4.0]


def test_a_micro_batch_is_sixteen_entries_in_prime_rl_order():
    assert FIELDS[:6] == (
        "input_ids", "loss_mask", "advantages", "inference_logprobs", "position_ids",
        "sequence_lengths",
    )  # fmt: skip
    assert len(FIELDS) == 16 and FIELDS[-1] == "ref_kl_weights"


def test_frame_shifts_mask_advantages_and_sampler_logprobs_by_one_token():
    frame, stats = grpo_rows_frame(read_rows_of(SAMPLES), pad_id=0, loss_config={})
    decoded = wire.loads(frame)
    context = decoded["context"]
    # row 0: tokens 2 and 3 are sampled, so columns 1 and 2 score them; the last column is 0
    assert context["loss_mask"][0].tolist() == [0, 1, 1, 0]
    assert context["old_log_probs_shifted"][0].tolist() == [0, -1.0, -2.0, 0]
    assert context["advantages"][0].tolist() == [0, 0.5, 0.5, 0]
    # row 1 is right-padded to width 4 with the pad id, masked there
    assert context["input_ids"][1].tolist() == [9, 10, 11, 0]
    assert context["loss_mask"][1].tolist() == [1, 1, 0, 0]
    assert torch.equal(decoded["kwargs"]["input_ids"], context["input_ids"])
    assert decoded["processing"]["loss_fn"] == "grpo"
    assert stats["trainable_tokens"] == 4


def read_rows_of(samples):
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        return read_rows(write(Path(d) / "rank_0.bin", msgspec.msgpack.encode([packed(samples)])))


def test_undecodable_bytes_fail_naming_the_file(tmp_path):
    path = write(tmp_path / "rollouts" / "step_3" / "rank_0.bin", b"\xc1not msgpack")
    with pytest.raises(RolloutFileError, match=r"step_3/rank_0.bin"):
        read_rows(path)


def test_a_mistyped_field_fails_naming_the_micro_batch_and_the_field(tmp_path):
    raw = msgspec.msgpack.decode(msgspec.msgpack.encode([packed(SAMPLES)]))
    raw[0][1] = "not a mask"
    path = write(tmp_path / "rank_0.bin", msgspec.msgpack.encode(raw))
    with pytest.raises(RolloutFileError, match=r"rank_0.bin.*micro-batch 0, field loss_mask"):
        read_rows(path)


def test_a_short_per_token_field_fails_naming_it(tmp_path):
    batch = packed(SAMPLES)
    batch.inference_logprobs = batch.inference_logprobs[:-1]
    path = write(tmp_path / "rank_0.bin", msgspec.msgpack.encode([batch]))
    with pytest.raises(RolloutFileError, match=r"field inference_logprobs has 6 entries for 7"):
        read_rows(path)


def test_sequence_lengths_that_do_not_cover_the_tokens_fail(tmp_path):
    batch = packed(SAMPLES)
    batch.sequence_lengths = [4, 2]
    path = write(tmp_path / "rank_0.bin", msgspec.msgpack.encode([batch]))
    with pytest.raises(RolloutFileError, match=r"field sequence_lengths=\[4, 2\]"):
        read_rows(path)


def test_multimodal_features_are_refused_not_dropped(tmp_path):
    batch = packed(SAMPLES)
    batch.mm_kwargs = {"pixel_values": ["float32", [1], b"\0\0\0\0"]}
    path = write(tmp_path / "rank_0.bin", msgspec.msgpack.encode([batch]))
    with pytest.raises(RolloutFileError, match=r"field mm_kwargs is set"):
        read_rows(path)


def test_a_non_finite_advantage_is_refused(tmp_path):
    batch = packed(SAMPLES)
    batch.advantages[2] = float("nan")
    path = write(tmp_path / "rank_0.bin", msgspec.msgpack.encode([batch]))
    with pytest.raises(RolloutFileError, match=r"field advantages\[2\] is not finite"):
        read_rows(path)


def test_a_version_is_published_only_with_its_manifest_and_stable(tmp_path):
    assert broadcasts.latest_published(tmp_path) is None
    directory = broadcasts.version_dir(tmp_path, 2)
    directory.mkdir(parents=True)
    (directory / broadcasts.STABLE).touch()  # STABLE alone: not one of ours
    assert broadcasts.published_versions(tmp_path) == []
    broadcasts.publish(tmp_path, 2, {"job_id": "j", "checkpoint_id": "cp_1"})
    assert broadcasts.latest_published(tmp_path)["checkpoint_id"] == "cp_1"


def test_a_manifest_under_the_wrong_folder_is_refused(tmp_path):
    broadcasts.publish(tmp_path, 1, {"job_id": "j", "checkpoint_id": "cp_1"})
    manifest = broadcasts.version_dir(tmp_path, 1) / broadcasts.MANIFEST
    manifest.write_text(json.dumps({"version": 2, "job_id": "j", "checkpoint_id": "cp_1"}))
    with pytest.raises(broadcasts.BroadcastError, match=r"version=2 does not match .*step_1"):
        broadcasts.read_manifest(manifest.parent)


def test_weight_dir_must_name_a_version():
    assert broadcasts.version_of("/x/broadcasts/step_12") == 12
    with pytest.raises(broadcasts.BroadcastError, match=r"weight_dir='/x/weights'"):
        broadcasts.version_of("/x/weights")


def test_files_recorded_from_prime_rl_decode_into_trainable_rows():
    files = sorted(DATA.glob("**/rank_0.bin"))
    assert len(files) == 3
    for path in files:
        rows = read_rows(path)
        assert rows and all(any(r.loss_mask) for r in rows)
        for row in rows:
            sampled = [lp for lp, m in zip(row.inference_logprobs, row.loss_mask, strict=True) if m]
            assert all(lp <= 0.0 for lp in sampled)


def test_every_recorded_row_gets_the_version_its_episode_started_at():
    """prime-rl's recorded run (lags 0, 1, 2): each row of a step's rollout file is found in
    that step's episodes file by its token ids, and the lags they give are prime-rl's own."""
    from cortex_recipes.primerl import step_records
    from cortex_recipes.primerl.trainer import row_versions

    lines = {
        r["step"]: r for r in map(json.loads, (DATA / "metrics.jsonl").read_text().splitlines())
    }
    for step in (1, 2, 3):
        path = DATA / "rollouts" / f"step_{step}" / "rank_0.bin"
        rows = read_rows(path)
        versions = row_versions(rows, step_records.sample_versions(DATA, step), str(path))
        lags = [(step - 1) - v for v in versions]
        assert len(versions) == len(rows)
        assert max(lags) == lines[step]["off_policy/max"]
        assert sum(lags) / len(lags) == pytest.approx(lines[step]["off_policy/mean"])


def test_a_row_in_no_shipped_episode_is_refused_naming_it():
    from cortex_recipes.primerl.trainer import row_versions

    rows = read_rows_of(SAMPLES)
    with pytest.raises(RolloutFileError, match="row 1 .3 tokens. is in no shipped episode"):
        row_versions(rows, {(5, 6, 7, 8): [2]}, "rank_0.bin")


def test_loglinear_frames_carry_versions_and_the_trainers_version():
    config = {"use_decoupled_loss": True, "prox_logp_method": "loglinear"}
    frame, _ = grpo_rows_frame(
        read_rows_of(SAMPLES), pad_id=0, loss_config=config, versions=[4, 2], current_version=5
    )
    decoded = wire.loads(frame)
    assert decoded["context"]["versions"].tolist() == [[4] * 4, [2] * 4]
    assert decoded["processing"]["config"]["current_version"] == 5
    assert decoded["processing"]["config"]["prox_logp_method"] == "loglinear"
    assert "prox_logp_shifted" not in decoded["context"]  # no forward for loglinear
