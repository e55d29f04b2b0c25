"""A glossary tool-use taskset on the verifiers v1 API (a mirror of verifiers' ``glossary``).

Provenance: verifiers' ``environments/glossary`` (PrimeIntellect-ai/verifiers, pinned in
recipes/agentic/tito/recipe.yaml) is git-only, so its *contract* is mirrored here, not its code
or data:

- entities, each with one fact (this project's five by default, or a task file's rows);
- one function tool, ``facts_lookup(name: str) -> str``, which returns the entity's fact
  (case- and whitespace-insensitive) or ``"no entry found"``;
- a prompt that asks the model to look the entity up and reply with exactly what the tool
  returns inside ``<answer></answer>`` tags, so an episode needs at least two assistant turns
  (the call, then the answer);
- the reward ``looked_up``: 1.0 when the fact appears (case-insensitively) in the last
  assistant reply, else 0.0.

Comparison questions (``questions`` in a TITO profile) need two lookups per episode: a row
names ``first`` and ``second`` (both glossary entities), an ``ask`` ("Which of the two was
founded first?") and the ``answer`` (one of the two names). The prompt asks the model to look up
both (two calls), and reply with the chosen name in ``<answer></answer>`` tags; the
reward ``named`` is 1.0 when the last reply names the answer and not the other entity.

Chain questions (``question_type: chain``) need two lookups in sequence: a row names a
``start`` entity whose fact names a ``via`` entity ("born in Corfield"), an ``ask`` ("Which
river runs through the town where Ada Birch was born?") and the ``answer``, which only the
``via`` entity's fact holds ("on the river Belen" -> "Belen"). The second call's argument comes
from the first call's result, so the calls cannot be made at once; the reward is ``named`` with
the ``via`` entity as the wrong name (answering with the first lookup's result scores 0).

The default entities and facts below are this project's own, checked in as
``recipes/agentic/tito/data/glossary.jsonl``; a profile's ``tasks`` names any file or pinned Hub
dataset with ``name`` and ``fact`` columns, loaded through ``datasets`` (:func:`load_facts`).
The classes are real verifiers v1
objects (``vf.Taskset``, ``vf.Task``, ``vf.Toolset`` with ``@vf.tool``, ``@vf.reward``), so the
taskset could run under a verifiers ``Env``; the TITO journey drives the same tool and reward
directly, turn by turn, through the ``TrainClient``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any

import verifiers.v1 as vf
from verifiers.v1.utils.decorators import discover_decorated

TOOL_NAME = "facts_lookup"
NOT_FOUND = "no entry found"

FACTS: dict[str, str] = {
    "ada lovelace": "wrote the first published computer program",
    "marie curie": "won Nobel prizes in physics and chemistry",
    "alan turing": "formalised computation with the Turing machine",
    "grace hopper": "built the first compiler for a programming language",
    "rosalind franklin": "imaged the structure of DNA with X-rays",
}


def prompt_for(entity: str) -> str:
    return (
        f'Use the `{TOOL_NAME}` tool to look up "{entity.title()}", then reply with exactly '
        "what it returns inside <answer></answer> tags."
    )


def entity_key(name: str) -> str:
    """The lookup key of an entity name: case- and whitespace-insensitive."""
    return " ".join(name.split()).lower()


class GlossaryToolsetConfig(vf.ToolsetConfig):
    facts: dict[str, str] = dict(FACTS)
    """Entity key (:func:`entity_key`) -> the fact the lookup returns."""


class GlossaryToolset(vf.Toolset[GlossaryToolsetConfig]):
    TOOL_PREFIX = "facts"

    @vf.tool
    def lookup(self, name: str) -> str:
        """Look up what a person or thing is known for."""
        return self.config.facts.get(entity_key(name), NOT_FOUND)


class GlossaryTaskConfig(vf.TaskConfig):
    tools: GlossaryToolsetConfig = GlossaryToolsetConfig()


class GlossaryTools:
    """The lookup tool of a glossary task (a mixin of the task classes)."""

    @classmethod
    def toolsets(cls, config: GlossaryTaskConfig) -> list[vf.Toolset]:
        return [GlossaryToolset(config.tools)]


class GlossaryTaskData(vf.TaskData):
    answer: str
    """The fact the lookup tool returns for this task's entity."""


class GlossaryTask(GlossaryTools, vf.Task[GlossaryTaskData, vf.State, GlossaryTaskConfig]):
    @vf.reward(weight=1.0)
    async def looked_up(self, trace: vf.Trace) -> float:
        return looked_up(self.data.answer, trace.last_reply)


class CompareTaskData(vf.TaskData):
    first: str
    second: str
    answer: str
    """The name the reply must give (``first`` or ``second``)."""

    @property
    def other(self) -> str:
        return self.second if entity_key(self.answer) == entity_key(self.first) else self.first


class CompareTask(GlossaryTools, vf.Task[CompareTaskData, vf.State, GlossaryTaskConfig]):
    @vf.reward(weight=1.0)
    async def named(self, trace: vf.Trace) -> float:
        return named(self.data.answer, self.data.other, trace.last_reply)


class ChainTaskData(vf.TaskData):
    start: str
    via: str
    """The entity the start's fact names (the second lookup), a wrong answer."""
    answer: str
    """The name in the ``via`` entity's fact that the reply must give."""


class ChainTask(GlossaryTools, vf.Task[ChainTaskData, vf.State, GlossaryTaskConfig]):
    @vf.reward(weight=1.0)
    async def named(self, trace: vf.Trace) -> float:
        return named(self.data.answer, self.data.via, trace.last_reply)


def chain_prompt(start: str, ask: str) -> str:
    return (
        f'Use the `{TOOL_NAME}` tool to look up "{start}", then look up the place it names. '
        f"{ask.strip()} Reply with the name inside <answer></answer> tags."
    )


def compare_prompt(first: str, second: str, ask: str) -> str:
    return (
        f'Use the `{TOOL_NAME}` tool to look up both "{first}" and "{second}". {ask.strip()} '
        "Reply with its name inside <answer></answer> tags."
    )


class GlossaryConfig(vf.TasksetConfig):
    task: GlossaryTaskConfig = GlossaryTaskConfig()


class GlossaryTaskset(vf.Taskset[GlossaryTask, GlossaryConfig]):
    def load(self) -> list[GlossaryTask]:
        return [
            GlossaryTask(
                GlossaryTaskData(
                    idx=i, name=entity.title(), prompt=prompt_for(entity), answer=fact
                ),
                self.config.task,
            )
            for i, (entity, fact) in enumerate(self.config.task.tools.facts.items())
        ]


def glossary_config(facts: dict[str, str]) -> GlossaryConfig:
    """The taskset config whose tasks and lookup tool both use ``facts``."""
    return GlossaryConfig(task=GlossaryTaskConfig(tools=GlossaryToolsetConfig(facts=facts)))


def compare_tasks(config: GlossaryConfig, questions: list[dict[str, str]]) -> list[CompareTask]:
    """One task per question (rows from :func:`load_questions`), on ``config``'s lookup tool."""
    return [
        CompareTask(
            CompareTaskData(
                idx=i,
                name=f"{q['first']} / {q['second']}",
                prompt=compare_prompt(q["first"], q["second"], q["ask"]),
                first=q["first"],
                second=q["second"],
                answer=q["answer"],
            ),
            config.task,
        )
        for i, q in enumerate(questions)
    ]


def chain_tasks(config: GlossaryConfig, questions: list[dict[str, str]]) -> list[ChainTask]:
    """One task per chain question (rows from :func:`load_chain_questions`)."""
    return [
        ChainTask(
            ChainTaskData(
                idx=i,
                name=q["start"],
                prompt=chain_prompt(q["start"], q["ask"]),
                start=q["start"],
                via=q["via"],
                answer=q["answer"],
            ),
            config.task,
        )
        for i, q in enumerate(questions)
    ]


def task_reward(task, last_reply: str | None) -> float:
    """The task's reward for the episode's last reply (the same as its ``@vf.reward``)."""
    if isinstance(task.data, ChainTaskData):
        return named(task.data.answer, task.data.via, last_reply)
    if isinstance(task.data, CompareTaskData):
        return named(task.data.answer, task.data.other, last_reply)
    return looked_up(task.data.answer, last_reply)


def fact_column(value: Any) -> bool:
    """a non-empty string"""
    return isinstance(value, str) and bool(value.strip())


def load_facts(field: str, source: str, base_dir: Path) -> dict[str, str]:
    """The glossary of a task file or pinned Hub dataset (``name`` and ``fact`` columns, through
    ``datasets``), keyed by :func:`entity_key`, in row order. A name given twice is refused,
    naming both rows."""
    from cortex_recipes.data import DataError, load_records

    rows = load_records(field, source, base_dir, {"name": fact_column, "fact": fact_column})
    facts: dict[str, str] = {}
    first: dict[str, int] = {}
    for n, row in enumerate(rows, start=1):
        key = entity_key(row["name"])
        if key in facts:
            raise DataError(
                f"{field}={source!r}: row {n} column 'name' = {row['name']!r} repeats row "
                f"{first[key]} (names are compared case- and whitespace-insensitively); each "
                "entity needs exactly one fact"
            )
        facts[key], first[key] = row["fact"].strip(), n
    return facts


Problem = Callable[[dict], str | None]  # what is wrong with a row, or None


def _checked_questions(
    rows: list[dict], origin: str, facts: dict[str, str], columns: tuple[str, ...], problem: Problem
) -> list[dict[str, str]]:
    """The ``columns`` of question ``rows`` read from ``origin`` (``field='source'``), each
    stripped. The first two columns name entities: both must be glossary entities, different
    from each other, and ``problem(row)`` must find nothing wrong with the row; anything else is
    refused naming the row, the column and the value."""
    from cortex_recipes.data import DataError

    one, other = columns[:2]
    for n, row in enumerate(rows, start=1):
        where = f"{origin}: row {n}"
        for column in (one, other):
            if entity_key(row[column]) not in facts:
                raise DataError(
                    f"{where} column {column!r} = {row[column]!r} is not in the glossary "
                    "(the profile's tasks); the lookup could not answer it"
                )
        if entity_key(row[one]) == entity_key(row[other]):
            raise DataError(f"{where}: {one} and {other} are the same entity {row[one]!r}")
        found = problem(row)
        if found:
            raise DataError(f"{where} {found}")
    return [{k: str(row[k]).strip() for k in columns} for row in rows]


def load_questions(
    field: str, source: str, base_dir: Path, facts: dict[str, str]
) -> list[dict[str, str]]:
    """Comparison questions (``first``, ``second``, ``ask``, ``answer`` columns, through
    ``datasets``). Both names must be glossary entities, different from each other, and the
    answer one of them; anything else is refused naming the row, the column and the value."""
    from cortex_recipes.data import load_records

    def answer_not_one_of_them(row: dict) -> str | None:
        if entity_key(row["answer"]) in (entity_key(row["first"]), entity_key(row["second"])):
            return None
        return (
            f"column 'answer' = {row['answer']!r} is neither first ({row['first']!r}) nor "
            f"second ({row['second']!r})"
        )

    columns = ("first", "second", "ask", "answer")
    rows = load_records(field, source, base_dir, dict.fromkeys(columns, fact_column))
    return _checked_questions(rows, f"{field}={source!r}", facts, columns, answer_not_one_of_them)


def load_chain_questions(
    field: str, source: str, base_dir: Path, facts: dict[str, str]
) -> list[dict[str, str]]:
    """Chain questions (``start``, ``via``, ``ask``, ``answer`` columns, through ``datasets``).
    The chain must hold in the glossary: ``start`` and ``via`` are different entities, the
    start's fact names ``via`` (the first lookup leads to the second) and the via's fact holds
    the answer; anything else is refused naming the row, the column and the value."""
    from cortex_recipes.data import load_records

    def broken_link(row: dict) -> str | None:
        start, via = entity_key(row["start"]), entity_key(row["via"])
        if via not in entity_key(facts[start]):
            return (
                f"column 'via' = {row['via']!r} is not named by the fact of {row['start']!r} "
                f"({facts[start]!r}); the first lookup would not lead there"
            )
        if entity_key(row["answer"]) not in entity_key(facts[via]):
            return (
                f"column 'answer' = {row['answer']!r} is not in the fact of {row['via']!r} "
                f"({facts[via]!r}); the second lookup would not find it"
            )
        return None

    columns = ("start", "via", "ask", "answer")
    rows = load_records(field, source, base_dir, dict.fromkeys(columns, fact_column))
    return _checked_questions(rows, f"{field}={source!r}", facts, columns, broken_link)


def answer_text(last_reply: str | None) -> str:
    """What the reply puts inside its last ``<answer></answer>`` tags (the whole reply if none)."""
    text = last_reply or ""
    start = text.rfind("<answer>")
    if start < 0:
        return text
    end = text.find("</answer>", start)
    return text[start + len("<answer>") : end if end >= 0 else len(text)]


def named(answer: str, other: str, last_reply: str | None) -> float:
    """The comparison reward: the answer's name, and not the other's, in the reply's answer
    (case- and whitespace-insensitive)."""
    given = entity_key(answer_text(last_reply))
    return float(entity_key(answer) in given and entity_key(other) not in given)


def looked_up(answer: str, last_reply: str | None) -> float:
    """The glossary reward: the fact, case-insensitively, somewhere in the last reply."""
    return float(answer.lower() in (last_reply or "").lower())


def tool_specs(toolset: vf.Toolset) -> list[vf.Tool]:
    """Function-tool declarations (``<prefix>_<name>``) for a toolset's ``@vf.tool`` methods."""
    specs = []
    for fn in discover_decorated(toolset, "tool"):
        params = {}
        for name, param in inspect.signature(fn).parameters.items():
            if param.annotation not in (str, "str"):
                raise TypeError(f"tool {fn.__name__}: parameter {name} must be a str")
            params[name] = {"type": "string"}
        specs.append(
            vf.Tool(
                name=f"{toolset.TOOL_PREFIX}_{getattr(fn, 'tool_name', None) or fn.__name__}",
                description=(fn.__doc__ or "").strip(),
                parameters={
                    "type": "object",
                    "properties": params,
                    "required": list(params),
                },
            )
        )
    return specs


def call_tool(toolset: vf.Toolset, name: str, arguments: Any) -> str:
    """Run one tool call; a bad call is answered in-band (as a tool message), not raised."""
    methods = {
        f"{toolset.TOOL_PREFIX}_{getattr(fn, 'tool_name', None) or fn.__name__}": fn
        for fn in discover_decorated(toolset, "tool")
    }
    if name not in methods:
        return f"error: unknown tool {name!r}; available: {sorted(methods)}"
    if not isinstance(arguments, dict):
        return f"error: arguments must be an object, got {arguments!r}"
    try:
        return str(methods[name](**arguments))
    except TypeError as exc:
        return f"error: bad arguments for {name}: {exc}"
