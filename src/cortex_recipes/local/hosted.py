"""Hosted-conformance mode: where the local backend behaves as hosted Cortex is documented to.

The default mode answers more generously than the hosted service documents (ids in save results,
logprobs in ``post_process_outputs``, no authentication, ...), so that the SDK's own calls work
end to end here. ``cortex-recipes serve --hosted`` (``LocalBackend(hosted=True)``, the
``local-hosted`` connection) answers the hosted way instead, so a journey's hosted path fails
here first when it relies on a generosity. Each difference is one named rule, applied at the one
place that handles it, and its error names the rule.

RULES below names each rule; docs/local-backend.md ("Hosted-conformance mode") says what each
does in both modes and lists every documented hosted behaviour with the rule that imitates it.
The data-plane rules are applied in :mod:`~cortex_recipes.local.data_plane` and the worker
(result shapes), the job rules in :mod:`~cortex_recipes.local.jobs` and
:mod:`~cortex_recipes.local.idle`, the PAT check in :mod:`~cortex_recipes.local.hosted_gate`.

What the local backend cannot imitate (hosted placement, GPU counts, whether a token is valid
for an account, model availability) is not checked by this mode; docs/local-backend.md lists it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cortex_recipes.local.errors import BackendError

RULES: dict[str, str] = {
    "forward-raw-dssst1": "the /operation forward refuses a base64-wrapped DSSST1 payload",
    "checkpoint-id-ignored": "save ignores a caller's checkpoint_id",
    "no-model-folders": "a model_name that is a folder on this machine is refused",
    "no-local-operations": "pause-generation and resume-generation are unknown operations",
    "save-result-stage-path": "a save result carries no checkpoint_id or checkpoint_type; "
    "the id is the cp_<id> segment of stage_path",
    "forward-logprobs-placement": "post_process_outputs comes back empty; logprobs are under "
    "batch.logprobs or at the top level, chosen per request",
    "sampler-logprob-floats": "a sampler logprob entry is a float, not a {logprob: x} object",
    "rows-per-rank": "a forward or forward-backward with fewer rows than the sub-job's n_gpus "
    "ranks is refused",
    "data-parallel-means": "a forward-backward's rows are sharded over n_gpus ranks; the loss "
    "is the mean of the ranks' local losses",
    "cce-needs-compute-logprobs": "causal_cross_entropy without post compute_logprobs is refused",
    "prefix-cache-drain": "reset-prefix-cache with drain waits for rows in flight and fails "
    "after timeout_s",
    "idle-timeout": "a job with no request for idle_timeout_seconds (default 1800) ends terminated",
    "hosted-job-states": "a new job walks pending, placing, initializing, then running",
    "pat-headers": "every request needs the PAT headers (Authorization: Bearer and "
    "X-Snowflake-Authorization-Token-Type: PROGRAMMATIC_ACCESS_TOKEN)",
}
LOCAL_OPERATIONS = ("pause-generation", "resume-generation")


def refuse(rule: str, message: str, status: int = 400) -> BackendError:
    assert rule in RULES, rule
    return BackendError(f"{message} (hosted-conformance rule {rule})", status=status)


# Where a forward's logprobs go in this mode (``forward-logprobs-placement``): hosted's assembler
# leaves ``post_process_outputs`` empty and peers look under ``batch``, then at the top level, so
# requests alternate between the two and a caller must handle both.
LOGPROB_PLACES = ("batch", "top")


def logprobs_place(n: int) -> str:
    """Where the ``n``-th forward of a job puts its logprobs in this mode."""
    return LOGPROB_PLACES[n % len(LOGPROB_PLACES)]


def check_rows_per_rank(rows: int, spec: Any, operation: str) -> None:
    """Rule ``rows-per-rank``: hosted Cortex shards a batch's rows over the sub-job's ranks."""
    if rows < spec.n_gpus:
        raise refuse(
            "rows-per-rank",
            f"{operation} has {rows} row(s) but sub-job {spec.sub_job_id} has n_gpus="
            f"{spec.n_gpus} ranks, and each rank needs at least one row; pad the batch with "
            "filler rows whose loss_mask is 0 (cortex_recipes.frames pads to the rank count)",
        )


def check_cce_post(processing: Any) -> None:
    """Rule ``cce-needs-compute-logprobs``: hosted's causal_cross_entropy reads the
    ``compute_logprobs`` post-processor's output and fails without it."""
    if processing.loss_fn == "causal_cross_entropy" and "compute_logprobs" not in processing.post:
        raise refuse(
            "cce-needs-compute-logprobs",
            "processing.loss_fn='causal_cross_entropy' needs processing.post=['compute_logprobs'] "
            f"(got post={list(processing.post)})",
        )


def save_result(result: dict[str, Any]) -> dict[str, Any]:
    """Rule ``save-result-stage-path``: a save result as hosted documents it, without
    ``checkpoint_id`` and ``checkpoint_type`` (the id is the ``cp_<id>`` segment of
    ``stage_path``)."""
    return {k: v for k, v in result.items() if k not in ("checkpoint_id", "checkpoint_type")}


def is_model_folder(name: str) -> bool:
    """``name`` names a folder on this machine rather than a model by name."""
    if name.startswith(("/", "./", "../", "~")):
        return True
    try:
        return Path(name).expanduser().is_dir()
    except (OSError, ValueError):
        return False
