"""The chain profile's qualification checks judge the run, not one step's draw."""

from recipes.agentic.tito.qualify import chain_checks


def run(multi_call, model_turns, eval_items=128):
    rewards = [1.0] * eval_items
    return {
        "multi_call": multi_call,
        "model_turns": model_turns,
        "eval_tasks": eval_items,
        "eval_before_rl": {"rewards": rewards},
        "eval_after_rl": {"rewards": rewards},
    }


def test_a_first_step_without_two_call_episodes_passes_when_the_share_rises():
    checks = chain_checks(run([0.0, 0.31, 0.94], [2.0, 2.3, 2.9]))
    assert checks["multi_call_share_rises"] and checks["multi_turn_episodes_every_step"]


def test_a_share_that_does_not_rise_fails():
    assert not chain_checks(run([0.5, 0.8, 0.5], [2.5, 2.8, 2.5]))["multi_call_share_rises"]


def test_a_step_whose_episodes_mostly_answer_without_calling_fails():
    checks = chain_checks(run([0.0, 0.3, 0.9], [2.0, 1.4, 2.9]))
    assert not checks["multi_turn_episodes_every_step"]


def test_a_short_eval_set_fails():
    assert not chain_checks(run([0.0, 0.9], [2.0, 2.9], eval_items=64))["held_out_eval"]
