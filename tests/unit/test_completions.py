"""rollouts.jsonl (cortex_recipes.completions): which groups are written, what a record holds,
and that a resumed run keeps only the records up to its checkpoint."""

from __future__ import annotations

import json

import pytest

from cortex_recipes import completions
from cortex_recipes.rollouts import Rollout
from cortex_recipes.tito.episode import Episode, TurnRecord

pytestmark = pytest.mark.unit


class Tokenizer:
    """ids -> letters; special ids (0) shown only when asked."""

    def decode(self, ids, skip_special_tokens=False):
        return "".join(
            "<s>" if i == 0 else chr(96 + i) for i in ids if i or not skip_special_tokens
        )


def test_every_steps_first_group_is_kept_and_the_rest_at_the_rate_deterministically():
    assert all(completions.keeps(step, 0, 0.0) for step in range(1, 50))
    assert not any(completions.keeps(step, g, 0.0) for step in range(1, 50) for g in range(1, 8))
    assert all(completions.keeps(step, g, 1.0) for step in range(1, 50) for g in range(8))
    half = [completions.keeps(step, g, 0.5) for step in range(1, 201) for g in range(1, 6)]
    assert 0.4 < sum(half) / len(half) < 0.6
    again = [completions.keeps(step, g, 0.5) for step in range(1, 201) for g in range(1, 6)]
    assert half == again


@pytest.mark.parametrize("rate", [-0.1, 1.5, "all", True])
def test_a_rate_outside_zero_to_one_is_refused_naming_the_field(rate, tmp_path):
    with pytest.raises(ValueError, match=r"rollouts_rate=.*accepted: a number from 0"):
        completions.RolloutWriter(tmp_path, Tokenizer(), rate=rate)


def test_a_group_record_holds_prompt_completion_ids_reward_and_policy_version(tmp_path):
    writer = completions.RolloutWriter(tmp_path, Tokenizer(), rate=0.0)
    group = [
        Rollout([0, 1, 2], [3, 4, 0], [-0.1, -0.2, -0.3], "stop"),
        Rollout([0, 1, 2], [5], [-1.0]),
    ]
    assert (
        writer.write_group(step=3, group=0, policy_version=2, rollouts=group, rewards=[1.0, 0.0])
        == 2
    )
    assert (
        writer.write_group(step=3, group=1, policy_version=2, rollouts=group, rewards=[1, 0]) == 0
    )
    first, second = completions.read(tmp_path)
    assert first == {
        "step": 3, "group": 0, "sample": 0, "policy_version": 2,
        "prompt": "<s>ab", "prompt_ids": [0, 1, 2],
        "completion": "cd", "completion_ids": [3, 4, 0],
        "reward": 1.0, "finish_reason": "stop",
    }  # fmt: skip
    assert second["completion"] == "e" and second["reward"] == 0.0 and second["sample"] == 1


def test_opd_records_carry_no_reward_and_the_extras(tmp_path):
    writer = completions.RolloutWriter(tmp_path, Tokenizer())
    writer.write_group(
        step=1, group=0, policy_version=0, rollouts=[Rollout([1], [2], [-0.5])],
        extras=[{"teacher_reverse_kl": 0.25}],
    )  # fmt: skip
    (record,) = completions.read(tmp_path)
    assert record["reward"] is None and record["teacher_reverse_kl"] == 0.25


def test_a_tito_episode_record_holds_its_turns_and_tool_calls(tmp_path):
    call = {"name": "lookup", "arguments": {"term": "ada"}}
    turns = [
        TurnRecord([0, 1], [2, 3], [-0.1, -0.1], False, "tool_calls", [call]),
        TurnRecord([0, 1, 2, 3, 9], [4], [-0.2], True, "stop", []),
    ]
    episode = Episode(
        task_index=7, reward=1.0, stop="answered", turns=turns, token_ids=[0, 1, 2, 3, 9, 4]
    )
    writer = completions.RolloutWriter(tmp_path, Tokenizer())
    assert writer.write_episodes(step=2, group=0, policy_version=1, episodes=[episode]) == 1
    (record,) = completions.read(tmp_path)
    assert record["prompt_ids"] == [0, 1] and record["completion_ids"] == [2, 3, 9, 4]
    assert record["completion"] == "bcid" and record["reward"] == 1.0
    assert record["finish_reason"] == "answered" and record["task_index"] == 7
    assert record["tool_calls"] == [call]
    assert [t["completion"] for t in record["turns"]] == ["bc", "d"]
    assert record["turns"][1]["bridged"] is True
    json.dumps(record)  # plain JSON


def test_a_resumed_run_drops_the_rollouts_after_its_checkpoint(tmp_path):
    from cortex_recipes.run import open_run
    from tests.unit.test_run import Profile, trainer

    run = open_run("sft", Profile(), {}, log_path=str(tmp_path))
    writer = completions.RolloutWriter(run.path, Tokenizer())
    for step in (1, 2, 3):
        writer.write_group(
            step=step, group=0, policy_version=step - 1, rollouts=[Rollout([1], [2], [0.0])]
        )
    run.checkpoints.save(2, {"trainer": trainer(), "config_hash": "hash-a"})
    resumed = open_run("sft", Profile(), {}, log_path=str(tmp_path))
    assert resumed.resumed_from_step == 2
    assert [r["step"] for r in completions.read(tmp_path)] == [1, 2]
