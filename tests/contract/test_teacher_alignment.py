"""Teacher scores line up with next-token predictions and the loss mask, or the step stops."""

import pytest
import torch

from cortex_recipes.distill.teacher import (
    TeacherScoreError,
    TeacherScores,
    TokenizerMismatchError,
    align_to_mask,
    check_same_tokenizer,
    extract_scores,
)
from cortex_recipes.frames import pad_batch, rollout_row
from cortex_recipes.models import load_tokenizer
from cortex_recipes.rollouts import Rollout

pytestmark = pytest.mark.contract

ROLLOUTS = [
    Rollout(prompt_ids=[5, 6, 7], completion_ids=[8, 9], sampler_logprobs=[-1.0, -2.0]),
    Rollout(prompt_ids=[5, 6], completion_ids=[10, 11, 12], sampler_logprobs=[-1.0, -1.0, -1.0]),
]


def batch_of(rollouts):
    return pad_batch([rollout_row(r) for r in rollouts], pad_id=0)


def completion_mask(rollouts):
    return batch_of(rollouts).loss_mask


def teacher_result(width=6, rows=2):
    # A fake teacher whose score at column i encodes (row, i): easy to see what was cut out.
    logprobs = torch.tensor([[-(10 * r + i) / 100 for i in range(width)] for r in range(rows)])
    return {"post_process_outputs": {"logprobs": logprobs}}


def test_mask_marks_the_columns_that_predict_sampled_tokens_only():
    batch = batch_of(ROLLOUTS)
    assert batch.input_ids.tolist() == [[5, 6, 7, 8, 9], [5, 6, 10, 11, 12]]
    mask = batch.loss_mask
    # row 0: column 2 predicts token 8 (first sampled), column 3 predicts 9; prompt and padding 0.
    assert mask.tolist() == [[0, 0, 1, 1, 0], [0, 1, 1, 1, 0]]


def test_teacher_scores_land_on_the_prompt_boundary_and_skip_padding():
    rollouts = [ROLLOUTS[0], Rollout([5], [6], [-1.0])]  # row 1 is padded
    mask = completion_mask(rollouts)
    scores = extract_scores(teacher_result(width=5), rollouts, mask.shape[1])
    aligned = align_to_mask(scores, mask)
    assert aligned[0].tolist() == pytest.approx([0, 0, -0.02, -0.03, 0])
    assert aligned[1].tolist() == pytest.approx([-0.10, 0, 0, 0, 0])
    assert torch.equal(aligned != 0, mask > 0)


def test_missing_teacher_result_names_where_it_looked():
    with pytest.raises(
        TeacherScoreError, match=r"no logprobs at post_process_outputs.logprobs, batch.logprobs"
    ):
        extract_scores({"post_process_outputs": {}}, ROLLOUTS, 5)


def test_mis_sized_teacher_result_is_rejected():
    with pytest.raises(TeacherScoreError, match=r"shape \[2, 4\]; expected \[2, 5\]"):
        extract_scores(teacher_result(width=4), ROLLOUTS, 5)


def test_wrong_length_names_the_row():
    mask = completion_mask(ROLLOUTS)
    scores = TeacherScores(offsets=[2, 1], values=[[-1.0, -1.0], [-1.0, -1.0]])
    with pytest.raises(
        TeacherScoreError, match="row 1: teacher returned 2 scores for 3 scored positions"
    ):
        align_to_mask(scores, mask)


def test_wrong_offset_names_the_row_and_shift():
    mask = completion_mask(ROLLOUTS)
    scores = TeacherScores(offsets=[3, 1], values=[[-1.0, -1.0], [-1.0, -1.0, -1.0]])
    with pytest.raises(
        TeacherScoreError, match="row 0: .* start at position 3 .* first scored position is 2"
    ):
        align_to_mask(scores, mask)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_score_names_row_and_position(bad):
    mask = completion_mask(ROLLOUTS)
    scores = TeacherScores(offsets=[2, 1], values=[[-1.0, -1.0], [-1.0, bad, -1.0]])
    with pytest.raises(TeacherScoreError, match="row 1, position 2 .*not finite"):
        align_to_mask(scores, mask)


def test_row_count_mismatch_is_rejected():
    with pytest.raises(TeacherScoreError, match="1 rows for a batch of 2"):
        align_to_mask(TeacherScores([2], [[-1.0, -1.0]]), completion_mask(ROLLOUTS))


def test_tokenizer_mismatch_is_rejected_at_start_up():
    check_same_tokenizer(
        load_tokenizer("smollm2-student-4l"), load_tokenizer("smollm2-135m-instruct")
    )
    with pytest.raises(TokenizerMismatchError, match="different vocabularies"):
        check_same_tokenizer(load_tokenizer("tiny-qwen3"), load_tokenizer("smollm2-135m-instruct"))
