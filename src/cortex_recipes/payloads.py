"""Forward-backward frames the journeys submit, built in one place and decoded in tests."""

from __future__ import annotations

import torch
from cortex_training import wire

from cortex_recipes.supervision import SFTBatch

RESPONSE_OPTIONS = {"response_options": {"format": "dssst1", "delivery": "chunked"}}


def sft_processing() -> dict:
    """The one processing block of every public SFT run (a fresh dict per call)."""
    return {"loss_fn": "causal_cross_entropy", "post": ["compute_logprobs"], "config": {}}


def sft_frame(batch: SFTBatch) -> bytes:
    """``causal_cross_entropy`` frame: no labels; context holds input_ids and the float mask."""
    return wire.dumps(
        {
            "args": (),
            "kwargs": {"input_ids": batch.input_ids},
            "context": {"input_ids": batch.input_ids, "loss_mask": batch.loss_mask},
            "processing": sft_processing(),
        },
        metadata=RESPONSE_OPTIONS,
    )


def legacy_labels_frame(batch: SFTBatch) -> bytes:
    """Compatibility only: model-side loss from ``labels``; fractional weights collapse to 0/1."""
    labels = torch.full_like(batch.input_ids, -100)
    # labels are token-aligned (the model shifts them); loss_mask column i weights token i + 1.
    supervised = batch.loss_mask[:, :-1] > 0
    labels[:, 1:] = torch.where(supervised, batch.input_ids[:, 1:], labels[:, 1:])
    return wire.dumps(
        {"args": (), "kwargs": {"input_ids": batch.input_ids, "labels": labels}},
        metadata=RESPONSE_OPTIONS,
    )
