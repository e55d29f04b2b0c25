"""What the TITO question tests (chain, compare) check alike: that the committed data files are
what their generator writes, and the tasks a profile's glossary and questions make."""

from __future__ import annotations

from tests.helpers import jsonl


def committed_split(generator) -> tuple[list[dict], list[dict], list[dict]]:
    """``generator.split()`` (glossary, train, held-out rows), asserting that the committed
    GLOSSARY, TRAIN and HELD_OUT files hold exactly those rows."""
    glossary, train, held_out = generator.split()
    assert generator.GLOSSARY.read_text() == jsonl(glossary)
    assert generator.TRAIN.read_text() == jsonl(train)
    assert generator.HELD_OUT.read_text() == jsonl(held_out)
    return glossary, train, held_out


def profile_tasks(profile, load_questions, make_tasks) -> tuple[dict[str, str], list]:
    """The profile's glossary facts and the tasks ``make_tasks`` builds from them and the
    questions ``load_questions`` reads from the profile's ``questions``."""
    from cortex_recipes.envs.glossary import glossary_config, load_facts

    facts = load_facts("tasks", profile.tasks, profile.recipe_dir)
    questions = load_questions("questions", profile.questions, profile.recipe_dir, facts)
    return facts, make_tasks(glossary_config(facts), questions)
