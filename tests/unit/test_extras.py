"""tests/extras.py: a test of another journey skips, naming the extra it needs, when only one
journey's extras are installed (a Nix shell, `uv sync --extra <one>`)."""

from __future__ import annotations

import pytest

from tests import extras

pytestmark = pytest.mark.unit


def test_extra_packages_follow_self_references():
    opd = extras.extra_packages("opd")
    assert {"renderers", "httpx", "fastapi", "peft"} <= set(opd)  # opd -> sft -> local
    assert "reasoning-gym" not in opd and "verifiers" not in opd
    assert extras.extra_packages("grpo")[-2:] == ["reasoning-gym", "msgspec"]


def test_a_missing_extra_is_named_with_its_missing_package(monkeypatch):
    absent = {"verifiers"}
    monkeypatch.setattr(extras, "_installed", lambda name: name not in absent)
    why = extras.missing("sft", "tito")
    assert why is not None
    assert why.startswith("needs the 'tito' extra (verifiers not installed)")
    assert "--extra tito" in why
    assert extras.missing("sft", "opd") is None
    mark = extras.requires("tito")
    assert mark.args == (True,) and mark.kwargs["reason"] == why
    assert extras.requires("sft").args == (False,)


def test_an_unknown_extra_fails_naming_the_accepted_ones():
    with pytest.raises(KeyError, match="no extra 'gpro'.*'grpo'"):
        extras.extra_packages("gpro")
