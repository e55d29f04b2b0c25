"""What a TITO checkpoint saves for an exact resume: the task sampler's state and the next
step's episodes with their action masks, refused when malformed or changed."""

from __future__ import annotations

import copy
import json

import pytest

pytest.importorskip("verifiers")

from cortex_recipes.tito.episode import Episode, TurnRecord
from cortex_recipes.tito.schedule import (
    ScheduleError,
    TaskSampler,
    pending_from_json,
    pending_to_json,
)
from cortex_recipes.tito.training import groups_digest

pytestmark = pytest.mark.unit


def test_the_sampler_continues_exactly_from_its_saved_state_and_not_from_its_seed():
    sampler = TaskSampler(5, seed=3)
    first = sampler.draw(7), sampler.nonce()  # crosses an epoch boundary
    saved = json.loads(json.dumps(sampler.state_dict()))  # as a checkpoint stores it
    expected = [sampler.draw(4) for _ in range(3)], sampler.nonce()
    restored = TaskSampler.from_state(saved, 5)
    assert ([restored.draw(4) for _ in range(3)], restored.nonce()) == expected
    reseeded = TaskSampler(5, seed=3)
    assert ([reseeded.draw(4) for _ in range(3)], reseeded.nonce()) != expected
    assert sorted(first[0][:5]) == [0, 1, 2, 3, 4]  # each epoch is a permutation


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda s: s.update(n_tasks=6), r"sampler.n_tasks=6 but the profile has 5 tasks"),
        (lambda s: s.update(order=[0, 0, 1, 2, 3]), r"sampler.order is not a permutation"),
        (lambda s: s.update(cursor=9), r"sampler.cursor=9"),
        (lambda s: s.update(rng=[3, ["x"], None]), r"sampler.rng cannot be restored"),
        (lambda s: s.update(version=0), r"sampler.version=0"),
    ],
)
def test_a_malformed_sampler_state_is_refused_naming_the_field(edit, message):
    state = TaskSampler(5, seed=0).state_dict()
    edit(state)
    with pytest.raises(ScheduleError, match=message):
        TaskSampler.from_state(state, 5)


def episode(task: int, tokens: list[int], mask: list[bool], reward: float) -> Episode:
    turn = TurnRecord(
        prompt_ids=tokens[:2], completion_ids=tokens[2:], logprobs=[-0.5] * (len(tokens) - 2),
        bridged=False, finish_reason="stop", tool_calls=[{"name": "facts_lookup", "arguments": "{}"}],
    )  # fmt: skip
    return Episode(
        task_index=task, reward=reward, stop="answered", turns=[turn], token_ids=tokens,
        sampled_mask=mask, logprobs=[0.0 if not m else -0.5 for m in mask],
    )  # fmt: skip


def saved_batch():
    groups = [
        [episode(0, [5, 6, 7, 8], [False, False, True, True], 1.0),
         episode(0, [5, 6, 9], [False, False, True], 0.0)],
        [episode(3, [5, 4, 7, 7, 2], [False, False, True, False, True], 0.5),
         episode(3, [5, 4, 1], [False, False, True], 0.5)],
    ]  # fmt: skip
    digest = groups_digest(groups)
    return groups, json.loads(json.dumps(pending_to_json(4, groups, digest, 12.5)))


def test_saved_episodes_come_back_with_the_same_rows_masks_and_logprobs():
    groups, saved = saved_batch()
    restored, seconds = pending_from_json(saved, 4, groups_digest)
    assert seconds == 12.5
    for a, b in zip([e for g in groups for e in g], [e for g in restored for e in g], strict=True):
        assert (a.token_ids, a.sampled_mask, a.logprobs, a.reward) == (
            b.token_ids,
            b.sampled_mask,
            b.logprobs,
            b.reward,
        )
        assert b.tool_calls == 1 and len(b.turns) == 1


def test_a_changed_mask_or_a_malformed_episode_is_refused_naming_the_field():
    _, saved = saved_batch()
    digest = groups_digest
    flipped = copy.deepcopy(saved)
    flipped["groups"][1][0]["sampled_mask"][3] = 1
    with pytest.raises(
        ScheduleError,
        match=r"pending.episodes_sha256=.* the saved rows or action masks were changed",
    ):
        pending_from_json(flipped, 4, digest)
    first = copy.deepcopy(saved)  # position 0, which the next-token shift would drop
    first["groups"][0][0]["sampled_mask"][0] = 1
    with pytest.raises(ScheduleError, match=r"the saved rows or action masks were changed"):
        pending_from_json(first, 4, digest)
    short = copy.deepcopy(saved)
    short["groups"][0][1]["logprobs"].pop()
    with pytest.raises(
        ScheduleError,
        match=r"pending.groups\[0\]\[1\]: token_ids \(3\), sampled_mask \(3\) and logprobs \(2\)",
    ):
        pending_from_json(short, 4, digest)
    with pytest.raises(ScheduleError, match=r"pending.step=4; the resume's next step is 5"):
        pending_from_json(saved, 5, digest)
    bad_reward = copy.deepcopy(saved)
    bad_reward["groups"][0][0]["reward"] = float("nan")
    with pytest.raises(ScheduleError, match=r"pending.groups\[0\]\[0\].reward=nan"):
        pending_from_json(bad_reward, 4, digest)
