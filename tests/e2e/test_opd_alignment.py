"""OPD's start-up alignment probe on the real scoring path: passes aligned, fails off by one.

The probe scores a sampler's own completions on a sub-job holding the same weights, through
the exact path teacher scores take (``forward`` -> ``extract_scores`` -> ``align_to_mask``).
A scorer whose logprob columns are shifted by one still has the right shape, the right count
per row and the right offsets, so only the value comparison can catch it.
"""

from __future__ import annotations

import pytest
import torch

from cortex_recipes.distill import teacher as teacher_lib
from recipes.distillation.on_policy.train import rollout
from tests import extras

from .conftest import inference, start, training

pytestmark = [pytest.mark.e2e, extras.requires("opd")]

PAD = 0
TOLERANCE = 0.05


@pytest.fixture(scope="module")
def job(client):
    job_id = start(client, [training(), inference()])
    ids = {s["job_type"]: s["sub_job_id"] for s in client.wait_for_job(job_id)["sub_jobs"]}
    prompts = [[11, 12, 13, 14, 15], [21, 22, 23]]  # unequal lengths: padding in the batch
    samples = rollout(client, job_id, prompts, {"max_tokens": 6, "temperature": 1.0, "seed": 3})
    yield job_id, ids, samples
    client.cancel_job(job_id)


class ShiftedScores:
    """The real client, except that ``forward`` results come back ``by`` columns off."""

    def __init__(self, client, by: int):
        self._client, self._by = client, by

    def __getattr__(self, name):
        return getattr(self._client, name)

    def poll_request(self, job_id, request_id, *args, **kwargs):
        result = self._client.poll_request(job_id, request_id, *args, **kwargs)
        outputs = result.get("post_process_outputs") if isinstance(result, dict) else None
        if isinstance(outputs, dict) and torch.is_tensor(outputs.get("logprobs")):
            shifted = torch.roll(outputs["logprobs"], shifts=self._by, dims=1)
            result = {**result, "post_process_outputs": {**outputs, "logprobs": shifted}}
        return result


def test_the_trainer_gives_back_the_sampler_logprobs_on_its_own_samples(client, job):
    job_id, ids, samples = job
    assert all(s.completion_ids for s in samples)
    probe = teacher_lib.check_alignment(client, job_id, ids["training"], samples, PAD, TOLERANCE)
    assert probe["positions"] == sum(len(s.completion_ids) for s in samples)
    assert probe["mean_abs_diff"] < 1e-3  # float32 on the CPU: the same numbers


@pytest.mark.parametrize("by", [1, -1])
def test_scores_one_column_off_fail_the_probe(client, job, by):
    job_id, ids, samples = job
    with pytest.raises(teacher_lib.TeacherAlignmentError, match=r"not aligned.*off-by-one"):
        teacher_lib.check_alignment(
            ShiftedScores(client, by), job_id, ids["training"], samples, PAD, TOLERANCE
        )
