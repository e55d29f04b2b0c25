"""The journeys' readers of answers whose shape differs between the local backend and hosted
Cortex: save results, sampler logprob entries and forward results; and frames fitted to ranks."""

from __future__ import annotations

import pytest
import torch
from cortex_training import wire

from cortex_recipes import frames, raw_forward, save_results
from cortex_recipes.local import losses
from cortex_recipes.rollouts import chosen_logprob

pytestmark = pytest.mark.unit

ID = "cp_" + "ab12" * 8


def test_the_checkpoint_id_comes_from_the_result_or_its_stage_path():
    assert save_results.checkpoint_id({"checkpoint_id": ID}) == ID
    path = f"s3://bucket/x/checkpoints/{ID}/global_step3/"
    assert save_results.checkpoint_id({"stage_path": path}) == ID
    assert save_results.checkpoint_id({"checkpoint_path": f"/tmp/checkpoints/{ID}"}) == ID
    normal = save_results.normalised({"stage_path": path}, "resumable")
    assert normal == {"stage_path": path, "checkpoint_id": ID, "checkpoint_type": "resumable"}
    with pytest.raises(save_results.SaveResultError, match="names no checkpoint"):
        save_results.checkpoint_id({"stage_path": "s3://bucket/elsewhere/"})


@pytest.mark.parametrize(
    "entry",
    [{"5": {"logprob": -0.5}}, {"5": -0.5}, {5: -0.5}, -0.5, {"9": {"logprob": -0.5}}, {"5": 0.0}],
)
def test_a_logprob_entry_is_read_in_every_documented_shape(entry):
    expected = 0.0 if entry == {"5": 0.0} else -0.5
    assert chosen_logprob(entry, 5) == expected


def test_an_entry_without_the_sampled_token_among_several_is_refused():
    with pytest.raises(ValueError, match="no candidate for sampled token 5"):
        chosen_logprob({"1": -0.1, "2": -0.2}, 5)
    with pytest.raises(ValueError, match="accepted: a number"):
        chosen_logprob({"5": {"lp": -0.1}}, 5)


@pytest.mark.parametrize(
    "result",
    [
        {"post_process_outputs": {"logprobs": torch.ones(1, 3)}},
        {"post_process_outputs": {}, "batch": {"logprobs": torch.ones(1, 3)}},
        {"post_process_outputs": {}, "logprobs": torch.ones(1, 3)},
        {"logprobs": [[1.0, 1.0, 1.0]]},
    ],
)
def test_forward_logprobs_are_found_wherever_the_endpoint_put_them(result):
    assert torch.equal(raw_forward.logprobs_of(result), torch.ones(1, 3))


def test_a_forward_result_without_logprobs_names_where_it_looked():
    with pytest.raises(raw_forward.RawForwardError, match="batch.logprobs or logprobs"):
        raw_forward.logprobs_of({"post_process_outputs": {}})


def _sft(rows, masks):
    b = frames.pad_batch([frames.Row(r, m) for r, m in zip(rows, masks, strict=True)], 0)
    return b, frames.sft_frame(b)


def test_one_rank_sends_the_frame_as_built():
    _, frame = _sft([[1, 2, 3]], [[0, 1, 1]])
    assert frames.for_ranks(frame, 1) is frame


def test_filler_rows_repeat_ids_and_carry_no_loss():
    b, frame = _sft([[1, 2, 3]], [[0, 1, 0.5]])
    fitted = wire.loads(frames.for_ranks(frame, 4))
    assert fitted["kwargs"]["input_ids"].shape == (4, 3)
    assert torch.equal(fitted["kwargs"]["input_ids"][3], b.input_ids[0])
    assert torch.equal(fitted["context"]["loss_mask"][1:], torch.zeros(3, 3))
    assert fitted["processing"]["config"] == {"dp_size": 4, "batch_num_tokens": 1.5}
    assert wire.read_metadata(frames.for_ranks(frame, 4)) == wire.read_metadata(frame)


def test_a_grpo_frame_counts_scored_tokens_and_refuses_a_per_sequence_mean_on_ranks():
    rows = [frames.Row([1, 2, 3], [0, 1, 1], [0.5] * 3, [-1.0] * 3)]
    b = frames.pad_batch(rows, 0)
    fitted = wire.loads(frames.for_ranks(frames.grpo_frame(b, {}), 2))
    assert fitted["processing"]["config"]["batch_num_tokens"] == 2
    assert torch.equal(fitted["context"]["advantages"][1], torch.zeros(3))
    seq = frames.grpo_frame(b, {"loss_agg_mode": "seq-mean-token-mean"})
    with pytest.raises(frames.FrameError, match="loss_agg_mode='seq-mean-token-mean'"):
        frames.for_ranks(seq, 2)


def _float64_token_mean(logprobs, mask):
    return float((-logprobs.double() * mask.double()).sum() / mask.double().sum())


def test_rank_means_differ_from_the_batch_mean_and_the_global_scale_restores_it():
    """Written from the formula: loss = mean over ranks of each rank's local value."""
    torch.manual_seed(0)
    logprobs = -torch.rand(3, 5, dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 1, 0], [0, 0, 0, 1, 0], [1, 1, 0, 0, 0]], dtype=torch.float64)
    context = {"loss_mask": mask}
    local, _ = losses.rank_mean_loss("causal_cross_entropy", logprobs, None, context, {}, ranks=2)
    shards = [(slice(0, 2)), (slice(2, 3))]
    expected = sum(_float64_token_mean(logprobs[s], mask[s]) for s in shards) / 2
    assert float(local) == pytest.approx(expected, abs=1e-12)
    scaled = {"dp_size": 2, "batch_num_tokens": float(mask.sum())}
    global_, _ = losses.rank_mean_loss(
        "causal_cross_entropy", logprobs, None, context, scaled, ranks=2
    )
    assert float(global_) == pytest.approx(_float64_token_mean(logprobs, mask), abs=1e-12)
    one, _ = losses.rank_mean_loss("causal_cross_entropy", logprobs, None, context, {}, ranks=1)
    assert float(one) == pytest.approx(_float64_token_mean(logprobs, mask), abs=1e-12)
