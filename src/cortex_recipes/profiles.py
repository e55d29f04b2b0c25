"""The one profile layer: checked-in profile files -> frozen, typed, documented settings.

A journey describes its profile as frozen dataclasses whose fields are made with
:func:`setting` (a doc string, and bounds or accepted values where they exist). Sections
nest: a field whose type is another profile dataclass is a section (``trainer``, ``eval``,
...), and ``section.field=value`` overrides reach it from the command line.

Invariants this module keeps:

- A profile file is read as it is written (JSON, or TOML by its suffix); overrides change
  that mapping, and only then is it checked and typed. ``raw`` is the mapping as read plus the
  overrides, and :func:`config_hash` hashes exactly that, so an unchanged file keeps the hash
  its evidence records (defaults are never written into it).
- Every problem is a :class:`ProfileError` naming the file, the dotted field, the value and
  what is accepted.
- Free-form blocks (``dict[str, Any]`` fields, e.g. ``training`` passed on to the SDK) are
  kept as they are; overrides may set keys inside them.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
import tomllib
import types
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cortex_recipes.provenance import config_hash

__all__ = [
    "JourneyProfile",
    "ProfileError",
    "config_hash",
    "describe",
    "entrypoint",
    "load",
    "at_least",
    "read_profile_file",
    "setting",
]

_DOC, _GE, _GT, _CHOICES = "doc", "ge", "gt", "choices"


class ProfileError(ValueError):
    """A profile that cannot run; the message names the file, the field, the value and what
    would be accepted."""


def setting(
    default: Any = dataclasses.MISSING,
    *,
    doc: str,
    ge: float | None = None,
    gt: float | None = None,
    choices: Sequence[Any] | None = None,
    default_factory: Any = dataclasses.MISSING,
) -> Any:
    """A profile field: its doc, an inclusive lower bound ``ge``, a strict one ``gt``, or the
    accepted ``choices``. Without a default the field is required."""
    metadata = {_DOC: doc, _GE: ge, _GT: gt, _CHOICES: tuple(choices) if choices else None}
    if default_factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=default_factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


# -- reading ---------------------------------------------------------------------------------


def read_profile_file(path: Path) -> dict[str, Any]:
    """The mapping a profile file holds (``.json``, or ``.toml``)."""
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError as exc:
        raise ProfileError(f"profile {path} does not exist") from exc
    except OSError as exc:
        raise ProfileError(f"profile {path} cannot be read: {exc}") from exc
    try:
        data = tomllib.loads(text) if path.suffix == ".toml" else json.loads(text)
    except ValueError as exc:
        kind = "TOML" if path.suffix == ".toml" else "JSON"
        raise ProfileError(f"profile {path} is not valid {kind}: {exc}") from exc
    if not isinstance(data, dict):
        raise ProfileError(f"profile {path} must hold an object, got {type(data).__name__}")
    return data


@dataclasses.dataclass(frozen=True)
class Ckpt:
    """A profile's ``ckpt`` section: resumable checkpoints."""

    interval: int = setting(1, ge=1, doc="a resumable save every this many (RL) steps")


@dataclasses.dataclass(frozen=True, kw_only=True)
class JourneyProfile:
    """What every journey's profile holds, once: its name and purpose, the model that trains,
    its steps, learning rate and training block (LoRA), the token budget of a row, the seed,
    the sub-jobs' dtype and GPUs, and where it was read from. A journey's
    profile extends it with its own fields (``@dataclass(frozen=True)``; these are
    keyword-only, so a journey's required fields may follow them)."""

    name: str = setting(doc="the profile name (the file's stem)")
    description: str = setting("", doc="what the profile is for")
    model: str = setting(
        doc="the model that trains: a fixture name, a hub name or a local model directory"
    )
    steps: int = setting(gt=0, doc="optimiser steps of the journey's training loop")
    learning_rate: float = setting(gt=0, doc="AdamW learning rate of those steps")
    training: dict[str, Any] = setting(
        default_factory=dict,
        doc="passed through to the training sub-job's training_config (peft_config for LoRA, "
        "gradient_clipping, ds_config, ...)",
    )
    max_seq_len: int = setting(
        gt=0, doc="tokens per row: prompt and completion, or a whole episode (rows are cut here)"
    )
    seed: int = setting(0, doc="seed of the run: data order, sampling and the sub-jobs")
    dtype: str = setting("float32", doc="model dtype of the sub-jobs")
    n_gpus: int = setting(1, ge=1, doc="GPUs per sub-job (hosted semantics)")
    # Not in the file: where it was read from and what it held (with any overrides).
    path: Path = dataclasses.field(default=Path(), metadata={"internal": True})
    raw: dict[str, Any] = dataclasses.field(default_factory=dict, metadata={"internal": True})

    @property
    def config_hash(self) -> str:
        """The hash a record pins this profile with (of ``raw``: the file plus overrides)."""
        return config_hash(self.raw)

    @property
    def recipe_dir(self) -> Path:
        """The journey folder (the one holding configs/): relative data is read from it."""
        return self.path.parent.parent.resolve()

    def sub_job_settings(self) -> dict[str, Any]:
        """What every sub-job of the journey shares: row budget, GPUs, dtype and seed."""
        return {"max_seq_len": self.max_seq_len, "n_gpus": self.n_gpus, "dtype": self.dtype,
                "seed": self.seed}  # fmt: skip

    def trainer_and_sampler(self, batch_size: int, **options: Any) -> list:
        """:func:`cortex_recipes.sub_jobs.journey_sub_jobs` on this profile's model, learning
        rate, training block and :meth:`sub_job_settings`; ``options`` override or add to them
        (``model``, ``learning_rate``, ``teacher``, ...)."""
        from cortex_recipes.sub_jobs import journey_sub_jobs

        settings = {"model": self.model, "learning_rate": self.learning_rate,
                    "training": self.training, **self.sub_job_settings(), **options}  # fmt: skip
        return journey_sub_jobs(settings.pop("model"), batch_size=batch_size, **settings)


def file_fields(cls: type) -> dict[str, dataclasses.Field]:
    """The fields a profile file may hold (not the ``internal`` ones set after reading)."""
    return {f.name: f for f in dataclasses.fields(cls) if not f.metadata.get("internal")}


def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _section_type(tp: Any) -> type | None:
    """The profile dataclass a field's type names (``X`` or ``X | None``), if any."""
    if dataclasses.is_dataclass(tp):
        return tp
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        inner = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(inner) == 1 and dataclasses.is_dataclass(inner[0]):
            return inner[0]
    return None


def _is_free_form(tp: Any) -> bool:
    return tp is dict or typing.get_origin(tp) is dict


def _type_name(tp: Any) -> str:
    if isinstance(tp, type) and not typing.get_args(tp):
        return tp.__name__
    return str(tp).replace("typing.", "")


def _check_value(tp: Any, value: Any, where: str) -> Any:
    """``value`` as field type ``tp`` (an int is accepted where a float is asked)."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return _check_value(inner[0], value, where)
    if tp is Any:
        return value
    if tp is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            if not math.isfinite(value):
                raise ProfileError(f"{where}={value!r} must be a finite number")
            return float(value)
    elif tp is int or tp is str or tp is bool:
        if isinstance(value, tp) and not (tp is int and isinstance(value, bool)):
            return value
    elif origin is list:
        if isinstance(value, list):
            return [_check_value(args[0], v, f"{where}[{i}]") for i, v in enumerate(value)]
    elif _is_free_form(tp):
        if isinstance(value, dict):
            return value
    else:
        raise TypeError(f"profile field {where} has an unsupported type {tp!r}")
    raise ProfileError(f"{where}={value!r} must be {_type_name(tp)}")


def build(cls: type, data: Any, where: str, prefix: str = "") -> Any:
    """The typed ``cls`` for the mapping ``data`` (read from ``where``)."""
    label = prefix.rstrip(".") or "profile"
    if not isinstance(data, dict):
        raise ProfileError(f"{where}: {label}={data!r} must be an object")
    fields = file_fields(cls)
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ProfileError(
            f"{where}: {label} has unknown keys {unknown}; accepted: {sorted(fields)}"
        )
    hints = _hints(cls)
    values = {}
    for name, f in fields.items():
        dotted = f"{prefix}{name}"
        if name not in data:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise ProfileError(
                    f"{where}: {dotted} is required ({_type_name(hints[name])}: "
                    f"{f.metadata.get(_DOC, '')})"
                )
            continue
        section = _section_type(hints[name])
        if section is not None and data[name] is not None:
            values[name] = build(section, data[name], where, f"{dotted}.")
            continue
        try:
            value = _check_value(hints[name], data[name], dotted)
        except ProfileError as exc:
            raise ProfileError(f"{where}: {exc}") from None
        _check_bounds(f, value, dotted, where)
        values[name] = value
    instance = cls(**values)
    check = getattr(instance, "check", None)
    if check is not None:
        problem = check()
        if problem:
            raise ProfileError(f"{where}: {prefix}{problem}")
    return instance


def _check_bounds(f: dataclasses.Field, value: Any, dotted: str, where: str) -> None:
    ge, gt, choices = f.metadata.get(_GE), f.metadata.get(_GT), f.metadata.get(_CHOICES)
    if choices and value not in choices:
        accepted = ", ".join(str(c) for c in choices)
        raise ProfileError(f"{where}: {dotted}={value!r}; accepted: {accepted}")
    if value is None or isinstance(value, list | dict | str | bool):
        return
    if ge is not None and value < ge:
        raise ProfileError(f"{where}: {dotted}={value!r} must be >= {ge}")
    if gt is not None and value <= gt:
        raise ProfileError(f"{where}: {dotted}={value!r} must be > {gt}")


# -- overrides -------------------------------------------------------------------------------


def parse_value(text: str) -> Any:
    """A command-line value: JSON when it parses (numbers, true/false, null, lists,
    objects), otherwise the string itself."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def apply_overrides(
    cls: type, raw: dict[str, Any], overrides: Sequence[str], where: str
) -> dict[str, Any]:
    """``raw`` with each ``dotted.key=value`` set; a key the profile does not have is refused
    with the keys it accepts there."""
    result = json.loads(json.dumps(raw))
    for item in overrides:
        key, sep, text = item.partition("=")
        if not sep or not key:
            raise ProfileError(f"{where}: override {item!r} must look like key=value")
        parts = key.split(".")
        target, section = result, cls
        for depth, part in enumerate(parts):
            dotted = ".".join(parts[: depth + 1])
            last = depth == len(parts) - 1
            if section is not None:
                names = list(file_fields(section))
                if part not in names:
                    scope = ".".join(parts[:depth]) or "the profile"
                    raise ProfileError(
                        f"{where}: override {key}={text}: {dotted} is not a field of {scope}; "
                        f"accepted: {', '.join(sorted(names))}"
                    )
                tp = _hints(section)[part]
                next_section = _section_type(tp)
                if not last and next_section is None and not _is_free_form(tp):
                    raise ProfileError(
                        f"{where}: override {key}={text}: {dotted} is a "
                        f"{_type_name(tp)}, not a section"
                    )
                section = next_section
            if last:
                target[part] = parse_value(text)
            else:
                child = target.get(part)
                if not isinstance(child, dict):
                    child = target[part] = {}
                target = child
    return result


def load(cls: type, path: str | Path, overrides: Sequence[str] = ()) -> tuple[Any, dict]:
    """``(typed profile, raw mapping)`` for the file at ``path`` with ``overrides`` applied."""
    path = Path(path)
    raw = apply_overrides(cls, read_profile_file(path), overrides, str(path))
    return build(cls, raw, str(path)), raw


# -- help ------------------------------------------------------------------------------------


def describe(cls: type, prefix: str = "") -> list[tuple[str, str, str, str]]:
    """``(dotted name, type, default, doc)`` for every field, sections expanded."""
    rows = []
    hints = _hints(cls)
    for f in file_fields(cls).values():
        dotted, tp = f"{prefix}{f.name}", hints[f.name]
        section = _section_type(tp)
        doc = f.metadata.get(_DOC, "")
        if section is not None:
            optional = " (optional section)" if f.default is None else ""
            rows.append((dotted, "section", "", f"{doc}{optional}"))
            rows.extend(describe(section, f"{dotted}."))
            continue
        if f.default is not dataclasses.MISSING:
            default = json.dumps(f.default)
        elif f.default_factory is not dataclasses.MISSING:
            default = json.dumps(f.default_factory())
        else:
            default = "required"
        bounds = []
        if f.metadata.get(_CHOICES):
            bounds.append("one of " + ", ".join(str(c) for c in f.metadata[_CHOICES]))
        if f.metadata.get(_GE) is not None:
            bounds.append(f">= {f.metadata[_GE]}")
        if f.metadata.get(_GT) is not None:
            bounds.append(f"> {f.metadata[_GT]}")
        rows.append(
            (dotted, _type_name(tp), default, doc + (f" ({'; '.join(bounds)})" if bounds else ""))
        )
    return rows


def help_text(cls: type) -> str:
    rows = describe(cls)
    width = max(len(r[0]) for r in rows) + 2
    lines = [
        f"Profile fields ({cls.__name__}); override any with <field>=<value> "
        "(dotted for sections, e.g. eval.max_tokens=32). Values are JSON where they parse:"
    ]
    for name, tp, default, doc in rows:
        if tp == "section":
            lines.append(f"  {name}{' ' * (width - len(name))}[section] {doc}")
        else:
            lines.append(f"  {name}{' ' * (width - len(name))}{tp}, default {default}: {doc}")
    return "\n".join(lines)


# -- the command line ------------------------------------------------------------------------


def entrypoint(config_cls: type, profile_cls: type, argv: Sequence[str] | None = None) -> Any:
    """A journey's command line: ``key=value`` for the chz ``config_cls`` (``profile=``,
    ``connection=``, ...); every other ``key=value`` overrides the profile (its fields, dotted
    for sections) and lands in the config's ``overrides``. ``--help`` lists both, with docs
    and defaults, on stdout (this is the command-line layer; the library itself only logs)."""
    import chz

    from_command_line = argv is None
    argv = list(sys.argv[1:] if argv is None else argv)
    if any(a in ("--help", "-h") for a in argv):
        journey_help = chz.Blueprint(config_cls).get_help(color=False)
        sys.stdout.write(f"{journey_help}\n{help_text(profile_cls)}\n")
        raise SystemExit(0)
    config_fields = {f for f in chz.chz_fields(config_cls)}
    config_args = [a for a in argv if a.partition("=")[0].split(".")[0] in config_fields]
    profile_args = [a for a in argv if a not in config_args]
    config = chz.entrypoint(config_cls, argv=config_args)
    if profile_args:
        config = chz.replace(config, overrides=(*config.overrides, *profile_args))
    if from_command_line:  # a person's command asks for progress bars; a test passing argv not
        from cortex_recipes import progress

        progress.configure(getattr(config, "progress", True))
    return config


# -- the command line of a journey -----------------------------------------------------------


def at_least(low: int, meaning: str = ""):
    """A chz field validator: the value is an integer of at least ``low``; the error names the
    field, the value and what is accepted (``meaning`` says what the smallest values mean)."""

    def check(config: Any, attr: str) -> None:
        value = getattr(config, attr)
        name = attr.removeprefix("X_")
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            note = f" ({meaning})" if meaning else ""
            raise ProfileError(f"{name}={value!r}; accepted: an integer >= {low}{note}")

    return check


def optional_at_least(low: int):
    """A chz field validator: None (the profile's value) or an integer of at least ``low``."""

    def check(config: Any, attr: str) -> None:
        value = getattr(config, attr)
        if value is None:
            return
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            name = attr.removeprefix("X_")
            raise ProfileError(
                f"{name}={value!r}; accepted: an integer >= {low} (leave it out for the "
                "profile's value)"
            )

    return check


def count_field(doc: str, *, low: int = 0, default: int | None = None, meaning: str = "") -> Any:
    """A command-line integer field of at least ``low`` (default: ``low``, which the journeys
    read as "the profile's value" or "off"), checked by :func:`at_least`; ``meaning`` (default:
    ``doc``) is what its error says the smallest values mean."""
    import chz

    return chz.field(
        validator=at_least(low, meaning or doc),
        default=low if default is None else default,
        doc=doc,
    )
