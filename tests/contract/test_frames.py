"""The one frames module: every journey's frame from one row type, pinned to handmade tensors.

The expected tensors below are written out by hand from the convention (column ``i`` of
every prediction-aligned tensor is about token ``i + 1``; padding on the right with the pad
id, never trained). Each front end (GRPO rollouts, TITO episodes, prime-rl samples, SFT
conversations, OPD teacher scoring) must reproduce them exactly, and a frame that is off by
one column must fail the same comparison.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from cortex_training import wire

from cortex_recipes import frames
from cortex_recipes.distill import teacher as teacher_lib
from cortex_recipes.primerl.rollout_files import Sample
from cortex_recipes.primerl.trainer import grpo_rows_frame
from cortex_recipes.rl.grpo import ScoredGroup, grpo_frame
from cortex_recipes.rollouts import Rollout
from cortex_recipes.supervision import collate
from cortex_recipes.tito.episode import Episode
from cortex_recipes.tito.training import episode_frame

pytestmark = pytest.mark.contract

PAD = 3
# One prompt [5, 6, 7], two completions: [8, 9] (reward 1) and [10] (reward 0).
ROLLOUTS = [Rollout([5, 6, 7], [8, 9], [-0.5, -0.25]), Rollout([5, 6, 7], [10], [-1.0])]
REWARDS = [1.0, 0.0]  # group-relative advantages +0.5 and -0.5

EXPECTED_GRPO = {
    "input_ids": [[5, 6, 7, 8, 9], [5, 6, 7, 10, PAD]],
    "loss_mask": [[0, 0, 1, 1, 0], [0, 0, 1, 0, 0]],
    "advantages": [[0, 0, 0.5, 0.5, 0], [0, 0, -0.5, 0, 0]],
    "old_log_probs_shifted": [[0, 0, -0.5, -0.25, 0], [0, 0, -1.0, 0, 0]],
}
GRPO_PROCESSING = {"loss_fn": "grpo", "config": {"eps_clip": 0.2, "loss_agg_mode": "token-mean"}}


def check_frame(frame: bytes, expected: dict, processing: dict) -> None:
    decoded = wire.loads(frame)
    ids = torch.tensor(expected["input_ids"], dtype=torch.long)
    assert torch.equal(decoded["kwargs"]["input_ids"], ids)
    assert set(decoded["context"]) == set(expected)
    for name, values in expected.items():
        got = decoded["context"][name]
        want = ids if name == "input_ids" else torch.tensor(values, dtype=torch.float32)
        assert got.dtype == want.dtype, name
        assert torch.equal(got, want), f"{name}: {got.tolist()} != {want.tolist()}"
    assert decoded["processing"] == processing


def test_shift_moves_token_values_one_column_left_and_zeroes_the_last():
    assert frames.shift([1.0, 2.0, 3.0]) == [2.0, 3.0, 0.0]
    assert frames.shift([]) == []
    one_hot = [0.0] * 3 + [1.0] + [0.0]  # token 3
    assert frames.shift(one_hot).index(1.0) == frames.prediction_column(3) == 2
    with pytest.raises(frames.FrameError, match="token_index=0"):
        frames.prediction_column(0)


def test_grpo_rollouts_give_the_handmade_frame():
    frame, stats = grpo_frame([ScoredGroup(0, ROLLOUTS, REWARDS)], PAD, {})
    check_frame(frame, EXPECTED_GRPO, GRPO_PROCESSING)
    assert stats["progress/output_tokens"] == 3


def test_tito_episodes_give_the_same_frame():
    episodes = [
        Episode(
            0,
            reward,
            "answered",
            [],
            r.ids,
            [False] * 3 + [True] * len(r.completion_ids),
            [0.0] * 3 + r.sampler_logprobs,
        )  # fmt: skip
        for r, reward in zip(ROLLOUTS, REWARDS, strict=True)
    ]
    frame, stats = episode_frame([episodes], PAD, {})
    check_frame(frame, EXPECTED_GRPO, GRPO_PROCESSING)
    assert stats["trainable_tokens"] == 3


def test_prime_rl_samples_give_the_same_frame():
    samples = [
        Sample(
            r.ids,
            [False] * 3 + [True] * len(r.completion_ids),
            [adv] * len(r.ids),
            [0.0] * 3 + r.sampler_logprobs,
            "math",
        )  # fmt: skip
        for r, adv in zip(ROLLOUTS, [0.5, -0.5], strict=True)
    ]
    frame, stats = grpo_rows_frame(samples, PAD, {})
    check_frame(frame, EXPECTED_GRPO, GRPO_PROCESSING)
    assert stats["advantage/mean"] == pytest.approx(0.5 / 3)


def test_a_frame_off_by_one_column_fails_the_comparison():
    rows = [frames.rollout_row(r, a) for r, a in zip(ROLLOUTS, [0.5, -0.5], strict=True)]
    # Shifting twice (a token-aligned field treated as token-aligned again) is off by one.
    twice = [
        frames.Row(r.token_ids, [*frames.shift(r.weights)], r.advantages, r.sampler_logprobs)
        for r in rows
    ]
    check_frame(frames.grpo_frame(frames.pad_batch(rows, PAD), {}), EXPECTED_GRPO, GRPO_PROCESSING)
    with pytest.raises(AssertionError, match="loss_mask"):
        check_frame(
            frames.grpo_frame(frames.pad_batch(twice, PAD), {}), EXPECTED_GRPO, GRPO_PROCESSING
        )


def test_sft_conversation_rows_give_the_handmade_frame():
    rows = [frames.Row([100, 101, 102, 103], [0.0, 0.0, 0.5, 0.5]), frames.Row([100, 104], [0, 1])]
    batch = collate(rows, pad_id=PAD, max_seq_len=8)
    check_frame(
        frames.sft_frame(batch),
        {
            "input_ids": [[100, 101, 102, 103], [100, 104, PAD, PAD]],
            "loss_mask": [[0, 0.5, 0.5, 0], [1, 0, 0, 0]],
        },
        {"loss_fn": "causal_cross_entropy", "post": ["compute_logprobs"], "config": {}},
    )
    labels = wire.loads(frames.legacy_labels_frame(batch))["kwargs"]["labels"]
    assert labels.tolist() == [[-100, -100, 102, 103], [-100, 104, -100, -100]]


class FakeTeacher:
    """A log_probability sub-job whose score at column ``i`` of row ``r`` is -(10 r + i) / 100."""

    _prefix = "/api"

    def __init__(self):
        self.sent = None

    def _send(self, method, url, *, data, params, headers, retry_on=None):
        """The raw forward transport's one call (cortex_recipes.raw_forward)."""
        assert (method, url, params) == ("POST", "/api/job/forward", {"sub_job_id": "teacher"})
        assert headers == {"Content-Type": "application/octet-stream"}
        self.sent = wire.loads(data)
        return SimpleNamespace(json=lambda: {"request_id": "r1"}, text="")

    def get_job(self, job_id):
        """Read once for the sub-job's rank count (one: no filler rows)."""
        return {"sub_jobs": [{"sub_job_id": "teacher", "inference_config": {"n_gpus": 1}}]}

    def poll_request(self, job_id, request_id):
        rows, width = self.sent["kwargs"]["input_ids"].shape
        scores = [[-(10 * r + i) / 100 for i in range(width)] for r in range(rows)]
        return {"post_process_outputs": {"logprobs": torch.tensor(scores)}}


def test_opd_teacher_scoring_gives_the_handmade_frame():
    client = FakeTeacher()
    scored = teacher_lib.score(client, "job", "teacher", ROLLOUTS, PAD)
    assert client.sent["kwargs"]["input_ids"].tolist() == EXPECTED_GRPO["input_ids"]
    assert client.sent["processing"] == {"post": ["compute_logprobs"]}
    advantages = torch.full_like(scored.loss_mask, -0.125) * scored.loss_mask
    config = {"eps_clip": 0.2, "teacher_tau": 1.0, "teacher_clip": 5.0}
    check_frame(
        frames.opd_frame(scored, advantages, config),
        {
            "input_ids": EXPECTED_GRPO["input_ids"],
            "loss_mask": EXPECTED_GRPO["loss_mask"],
            "advantages": [[0, 0, -0.125, -0.125, 0], [0, 0, -0.125, 0, 0]],
            "old_log_probs_shifted": EXPECTED_GRPO["old_log_probs_shifted"],
            # row 0 completion tokens 3, 4 are scored at columns 2, 3; row 1 token 3 at column 2
            "teacher_log_probs_shifted": [[0, 0, -0.02, -0.03, 0], [0, 0, -0.12, 0, 0]],
        },
        {"loss_fn": "grpo", "post": ["compute_logprobs"], "config": config},
    )


def test_pad_id_is_pad_then_eos_then_an_error():
    assert frames.pad_id(SimpleNamespace(pad_token_id=7, eos_token_id=2)) == 7
    assert frames.pad_id(SimpleNamespace(pad_token_id=0, eos_token_id=2)) == 0
    assert frames.pad_id(SimpleNamespace(pad_token_id=None, eos_token_id=2)) == 2
    with pytest.raises(frames.FrameError, match="pad_token_id=None and eos_token_id=None"):
        frames.pad_id(SimpleNamespace(pad_token_id=None, eos_token_id=None))


def test_rows_fail_closed_on_length_and_missing_fields():
    with pytest.raises(frames.FrameError, match=r"Row.weights has 2 values for 3 token ids"):
        frames.Row([1, 2, 3], [0.0, 1.0])
    with_adv = frames.rollout_row(ROLLOUTS[0], 0.5)
    with pytest.raises(frames.FrameError, match=r"rows \[1\] have no advantages"):
        frames.pad_batch([with_adv, frames.rollout_row(ROLLOUTS[1])], PAD)
    with pytest.raises(frames.FrameError, match="needs advantages"):
        frames.grpo_frame(frames.pad_batch([frames.Row([1, 2], [0, 1])], PAD), {})
    with pytest.raises(frames.FrameError, match="pad_id=-1"):
        frames.pad_batch([with_adv], -1)
