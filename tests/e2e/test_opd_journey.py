"""A short on-policy distillation run on the local backend (real student, real frozen teacher)."""

import json

import pytest

from recipes.distillation.on_policy.train import Config, main
from tests import extras

pytestmark = [pytest.mark.e2e, pytest.mark.slow, extras.requires("opd")]


def test_opd_two_steps_score_every_sampled_token_and_keep_the_teacher_frozen(tmp_path):
    summary = main(Config(steps=2, log_path=str(tmp_path)))
    metrics = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2]
    for m in metrics:
        assert m["teacher_term_token_count"] == m["sampled_tokens"] > 0
        assert m["teacher_reverse_kl"] == m["teacher_reverse_kl"]  # finite, not NaN
    # main() compares the teacher's fingerprint at the start, at the eval (step 2) and at the
    # end, and raises if it moved.
    assert len(summary["teacher_fingerprints"]) == 3 and summary["teacher_frozen"] is True
    assert summary["checkpoint_id"].startswith("cp_")
    probe = summary["alignment"]  # the start-up probe: sampler logprobs back from the trainer
    assert probe["positions"] > 0 and probe["mean_abs_diff"] < 1e-3
    written = [json.loads(x) for x in (tmp_path / "rollouts.jsonl").read_text().splitlines()]
    assert [r["step"] for r in written if r["group"] == 0] == [1, 2]
    assert all(r["reward"] is None and "teacher_reverse_kl" in r for r in written)
