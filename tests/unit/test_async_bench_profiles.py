"""bench/async_vs_sync.py's profile pair: the latency and overrides reach both loops, the
synchronous twin drops only the async-only keys and the off-policy correction."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cortex_recipes.rl.grpo_profile import load_grpo_profile
from tests.helpers import ROOT, load_script

pytestmark = pytest.mark.unit

bench = load_script("bench/async_vs_sync.py", "async_vs_sync")
PROFILE = ROOT / "recipes/rl/async_grpo/configs/local-cpu-smollm2-lora.json"


def test_both_profiles_wait_the_same_latency_and_take_the_same_overrides(tmp_path: Path):
    overrides = ["orchestrator.batch_size=16", "orchestrator.max_inflight_groups=2"]
    async_path, sync_path = bench.profile_pair(PROFILE, tmp_path, overrides, 2.0)
    async_profile, sync_profile = load_grpo_profile(async_path), load_grpo_profile(sync_path)
    assert async_profile.is_async and not sync_profile.is_async
    for profile in (async_profile, sync_profile):
        assert profile.env.latency_s == 2.0
        assert profile.orchestrator.batch_size == 16
        assert profile.steps == json.loads(PROFILE.read_text())["steps"]
        assert profile.lr_schedule == async_profile.lr_schedule
    assert async_profile.orchestrator.max_inflight_groups == 2
    assert async_profile.loss.use_decoupled_loss is True
    # on-policy rollouts: the correction is the identity, and its keys are not sent
    assert sync_profile.loss.use_decoupled_loss is None
    assert sync_profile.loss.prox_logp_method is None
    assert sync_profile.loss.eps_clip == async_profile.loss.eps_clip
    assert sync_profile.ckpt is None


def test_set_values_parse_as_json_where_they_can():
    assert bench.parse_value("16") == 16
    assert bench.parse_value("true") is True
    assert bench.parse_value("linear") == "linear"
