"""``python -m recipes.rl.async_grpo.train runner=prime-rl``: the journey on prime-rl's own
orchestrator, end to end on the local backend. Runs only where a prime-rl environment exists
(``CORTEX_RECIPES_PRIMERL_PYTHON``; recipes/rl/async_grpo/primerl/install.sh builds one)."""

from __future__ import annotations

import json
import os

import pytest

from cortex_recipes import profiles
from cortex_recipes.primerl.launch import ENV_VAR
from cortex_recipes.rl.profile import GRPOProfile
from recipes.rl.async_grpo import train
from tests import extras

pytestmark = [
    pytest.mark.e2e,
    extras.requires("grpo"),
    pytest.mark.skipif(
        not os.environ.get(ENV_VAR),
        reason=f"no prime-rl environment: set {ENV_VAR} to its python",
    ),
]
SMOKE = "recipes/rl/async_grpo/configs/local-cpu-tiny-qwen3-smoke.json"


def test_the_journey_trains_on_prime_rl_and_keeps_both_sides_metrics(tmp_path):
    config = profiles.entrypoint(
        train.Config,
        GRPOProfile,
        ["runner=prime-rl", f"profile={SMOKE}", "max_steps=2", f"log_path={tmp_path / 'run'}"],
    )
    out = train.main(config)
    assert out["orchestrator"] == "prime-rl"
    assert out["steps"] == [1, 2] and out["published_versions"] == [0, 1, 2]
    assert [e["step"] for e in out["eval_accuracy"]] == [0, 2]  # the builtin runner's eval set
    records = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2]
    assert all(r["samples"] == 8 for r in records)  # batch_size 8, nothing filtered
    assert any(k.startswith("primerl/") for k in records[-1]), records[-1]
    assert out["inference_counters"]["generate_requests"] >= 16
    orch = (tmp_path / "run" / "primerl" / "orch.toml").read_text()
    assert 'id = "cortex-arith"' in orch
