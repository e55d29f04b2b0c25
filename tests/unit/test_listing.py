"""`cortex-recipes list` and `--version` (cortex_recipes.listing, cli)."""

from __future__ import annotations

from pathlib import Path

import pytest

from cortex_recipes import cli, journeys
from cortex_recipes.listing import journey_rows, render

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]


def test_every_profile_of_every_journey_is_listed_with_its_recipe_status():
    rows = journey_rows(ROOT)
    for journey in journeys.load_journeys(ROOT):
        recipe = journeys.load_recipe(journey.path(ROOT) / "recipe.yaml")
        listed = {r.profile: r for r in rows if r.journey == journey.name}
        for profile in journeys.recipe_profiles(recipe):
            row = listed.pop(profile["name"])
            assert row.hardware == profile["hardware"]
            assert row.validated == (str(profile["last_validated"] or "not validated"))
        assert not listed


def test_a_planned_journey_is_one_row_without_profiles(tmp_path):
    (tmp_path / "journeys.toml").write_text(
        '[[journey]]\nname = "later"\nfolder = "recipes/x/later"\nextra = "sft"\n'
        'entry_point = "recipes.x.later.train"\nsmoke = "python -m recipes.x.later.train"\n'
        'status = "planned"\n'
    )
    (row,) = journey_rows(tmp_path)
    assert (row.journey, row.status, row.profile) == ("later", "planned", "-")


def test_list_prints_one_line_per_profile(capsys):
    assert cli.main(["list", "--root", str(ROOT)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["journey", "status", "profile", "hardware", "validated"]
    assert len(out) == 1 + len(journey_rows(ROOT))
    assert any(
        line.split()[:4] == ["sft", "landed,", "beta", "local-cpu-smollm2-lora"] for line in out
    )


def test_render_wide_adds_the_purpose():
    text = render(journey_rows(ROOT), wide=True)
    assert text.splitlines()[0].split()[-1] == "purpose" and "qualification" in text


def test_version_names_this_package_and_the_sdk(capsys):
    with pytest.raises(SystemExit) as exited:
        cli.main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out.strip() == "cortex-recipes 0.1.0 (cortex-training 0.0.3)"
