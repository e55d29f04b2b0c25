"""`cortex-recipes validate`: the real repository passes, and each class of problem is caught."""

from __future__ import annotations

import json

import pytest
import yaml

from cortex_recipes import cli, journeys, validate
from cortex_recipes.repo_checks import readme, references
from tests import extras
from tests.unit.recipe_fixtures import OPD, ROOT, SFT, copy_repository, edit

# The validator checks that every landed journey's entry point imports only installed
# packages, so it needs every journey's extra (`nix develop`, `uv sync --all-extras`).
pytestmark = [pytest.mark.unit, extras.requires("sft", "opd", "grpo", "tito")]


@pytest.fixture
def repo(tmp_path):
    return copy_repository(tmp_path / "repo")


def problems_of(root) -> list[str]:
    return validate.validate_repository(root)


def the_problem_after_editing(repo, path: str, old: str, new: str) -> str:
    """The one problem reported once the first ``old`` in ``repo/path`` is ``new``."""
    edit(repo / path, old, new)
    [problem] = problems_of(repo)
    return problem


def _recipe(repo, folder=SFT) -> dict:
    return yaml.safe_load((repo / folder / "recipe.yaml").read_text())


def _write_recipe(repo, data, folder=SFT) -> None:
    (repo / folder / "recipe.yaml").write_text(yaml.safe_dump(data, sort_keys=False))


def test_repository_passes_validator():
    assert validate.validate_repository(ROOT) == []


def test_recipes_index_is_up_to_date():
    assert journeys.index_is_current(ROOT), "run `cortex-recipes catalog sync`"


def test_copied_repository_passes(repo):
    assert problems_of(repo) == []


# --- README sections ----------------------------------------------------------------------


def test_missing_readme_section_is_reported(repo):
    edit(repo / SFT / "README.md", "## Troubleshooting", "## Known issues")
    assert problems_of(repo) == [
        f"{SFT}/README.md: missing required section 'Troubleshooting' (a '## Troubleshooting' "
        "heading)"
    ]


@pytest.mark.parametrize(
    ("heading", "counts"),
    [
        ("## Expected metrics", True),
        ("## EXPECTED METRICS", True),
        ("## Expected metrics (CPU profiles)", True),
        ("## Expected metrics: CPU", True),
        ("## Expected metricses", False),
        ("### Expected metrics", False),
        ("# Expected metrics", False),
    ],
)
def test_section_heading_rule(heading, counts):
    assert readme.has_section(readme.section_headings(heading + "\n"), "Expected metrics") is (
        counts
    )


def test_heading_inside_a_code_fence_does_not_count():
    text = "```bash\n## Commands\n```\n"
    assert not readme.has_section(readme.section_headings(text), "Commands")


def test_missing_readme_is_reported(repo):
    (repo / SFT / "README.md").unlink()
    assert f"{SFT}/README.md: missing (every journey has a README.md)" in problems_of(repo)


# --- entry points -------------------------------------------------------------------------


def test_missing_entry_point_module_is_reported(repo):
    (repo / SFT / "train.py").unlink()
    found = problems_of(repo)
    assert (
        f"{SFT}: entry_point='recipes.sft.conversational.train' is not importable: no module "
        "file in the repository"
    ) in found


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("def main(:\n", "does not parse: invalid syntax"),
        ("import not_a_package_anywhere\n", "package 'not_a_package_anywhere' is not installed"),
        ("from cortex_recipes import sft\nfrom recipes.sft.nowhere import x\n", "not a module"),
        ("def main():\n    pass\n\n\nmain()\n", "line 5 runs Expr at import"),
        ("def main():\n    pass\n", 'has no `if __name__ == "__main__":` guard'),
    ],
    ids=["syntax", "missing-package", "missing-repo-module", "runs-at-import", "no-main-guard"],
)
def test_unimportable_or_eager_entry_point_is_reported(repo, source, message):
    guard = '\n\nif __name__ == "__main__":\n    main()\n' if "guard" not in message else ""
    (repo / SFT / "train.py").write_text(source + guard)
    found = [p for p in problems_of(repo) if p.startswith(f"{SFT}/train.py: ")]
    assert len(found) == 1 and message in found[0], found


def test_entry_point_must_agree_with_journeys_toml(repo):
    edit(
        repo / "journeys.toml",
        'entry_point = "recipes.sft.conversational.train"',
        'entry_point = "recipes.sft.conversational.qualify"',
    )
    assert any(
        "entry_point='recipes.sft.conversational.train' differs" in p for p in problems_of(repo)
    )


# --- configs ------------------------------------------------------------------------------


def test_config_that_is_not_json_is_reported(repo):
    (repo / SFT / "configs" / "local-cpu-tiny-qwen3.json").write_text("{not json")
    found = problems_of(repo)
    assert any(
        p.startswith(f"{SFT}/configs/local-cpu-tiny-qwen3.json: not valid JSON") for p in found
    )


def test_config_outside_a_typed_bound_is_reported_before_the_sdk_sees_it(repo):
    problem = the_problem_after_editing(
        repo, f"{SFT}/configs/local-cpu-tiny-qwen3.json", '"n_gpus": 1', '"n_gpus": 0'
    )
    assert problem.startswith(f"{SFT}/configs/local-cpu-tiny-qwen3.json: ")
    assert "the profile loader rejects it" in problem and "n_gpus=0 must be >= 1" in problem


def test_config_the_profile_loader_rejects_is_reported(repo):
    problem = the_problem_after_editing(
        repo,
        f"{SFT}/configs/local-cpu-tiny-qwen3.json",
        '"renderer": "qwen3"',
        '"renderer": "jinja"',
    )
    assert "the profile loader rejects it" in problem and "renderer='jinja'" in problem


def test_sub_job_configs_without_a_loader_go_through_the_sdk_factories(repo):
    edit(
        repo / "journeys.toml",
        'profile_loader = "cortex_recipes.sft:load_profile"',
        'profile_loader = ""',
    )
    config = repo / SFT / "configs" / "local-cpu-tiny-qwen3.json"
    raw = json.loads(config.read_text())
    raw["sub_job_configs"] = [
        {
            "job_type": "sampling",
            "model_name": "tiny-qwen3",
            "inference_config": {"max_seq_len": 0, "n_gpus": 1},
        }
    ]
    config.write_text(json.dumps(raw))
    assert problems_of(repo) == [
        f"{SFT}/configs/local-cpu-tiny-qwen3.json: sub_job_configs[0]: the SDK rejects it: "
        "sampling.max_seq_len must be > 0"
    ]


def test_config_not_listed_as_a_profile_is_reported(repo):
    (repo / SFT / "configs" / "extra.json").write_text("{}")
    assert f"{SFT}/configs/extra.json: not listed as a profile in {SFT}/recipe.yaml" in problems_of(
        repo
    )


# --- recipe.yaml schema -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            lambda d: d.update(status="experimental"),
            "status: 'experimental' is not one of 'alpha', 'beta', 'stable'",
        ),
        (lambda d: d["provenance"].pop("commit"), "provenance.commit: required field is missing"),
        (
            lambda d: d["provenance"].update(commit="main"),
            "provenance.commit: 'main' does not match",
        ),
        (lambda d: d.update(default_gpus="one"), "default_gpus: 'one' is not of type integer"),
        (lambda d: d.pop("models"), "models: required field is missing"),
        (lambda d: d["models"][0].update(role="boss"), "models[0].role: 'boss' is not one of"),
        (
            lambda d: d["datasets"][0].pop("revision"),
            "datasets[0]: matches none of the accepted forms",
        ),
        (
            lambda d: d["profiles"][0].update(last_validate=None),
            "profiles[0].last_validate: unknown field",
        ),
        (
            lambda d: d.update(last_validated="29/11/2026"),
            "last_validated: matches none of the accepted forms",
        ),
    ],
    ids=[
        "status",
        "no-commit",
        "commit-not-hex",
        "gpus-type",
        "no-models",
        "role",
        "dataset-unpinned",
        "typo",
        "date",
    ],
)
def test_recipe_schema_violation_is_reported(repo, change, message):
    data = _recipe(repo)
    change(data)
    _write_recipe(repo, data)
    found = problems_of(repo)
    assert any(p.startswith(f"{SFT}/recipe.yaml: ") and message in p for p in found), found


# --- missing files ------------------------------------------------------------------------


def test_missing_profile_config_is_reported(repo):
    data = _recipe(repo)
    data["profiles"][0]["config"] = "configs/nope.json"
    _write_recipe(repo, data)
    found = problems_of(repo)
    assert (
        f"{SFT}/recipe.yaml: profiles[local-cpu-tiny-qwen3].config='configs/nope.json' does not exist"
        in found
    )


def test_missing_dataset_file_is_reported(repo):
    (repo / OPD / "data" / "prompts.jsonl").unlink()
    found = problems_of(repo)
    assert f"{OPD}/recipe.yaml: datasets[0].path='data/prompts.jsonl' does not exist" in found
    assert (
        f"{OPD}/configs/local-cpu-smollm2-teacher.json: 'data/prompts.jsonl' does not exist in {OPD}"
        in found
    )


def test_changed_dataset_needs_a_new_revision(repo):
    with (repo / SFT / "data" / "identity.jsonl").open("a") as f:
        f.write('{"messages": [{"role": "user", "content": "hi"}]}\n')
    [problem] = problems_of(repo)
    assert (
        problem.startswith(f"{SFT}/recipe.yaml: datasets[0].revision='sha256:")
        and "does not match" in problem
    )


def test_dangling_readme_link_and_command_path_are_reported(repo):
    readme = repo / SFT / "README.md"
    edit(readme, "## Outcome\n", "## Outcome\n\nSee [the notes](notes.md).\n")
    edit(readme, "configs/local-cpu-smollm2-lora.json\n", "configs/local-cpu-smollm2-lorra.json\n")
    found = problems_of(repo)
    assert f"{SFT}/README.md: link target 'notes.md' does not exist" in found
    assert f"{SFT}/README.md: '{SFT}/configs/local-cpu-smollm2-lorra.json' does not exist" in found


# --- mutable references -------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "pip install git+https://github.com/org/repo@main",
        "pip install renderers",
        "python3 -m pip install -U renderers",
        "uv pip install 'verifiers>=0.4'",
        "docker run ghcr.io/org/image:latest",
        "uv sync --all-extras",
        "uv run python -m recipes.sft.conversational.train",
        "git+https://github.com/org/repo",
    ],
)
def test_mutable_reference_is_found(text):
    assert references.mutable_references(text)


@pytest.mark.parametrize(
    "text",
    [
        'python3 -m pip install "uv==0.13.9" && python3 -m uv run --frozen --all-extras pytest',
        "pip install -e . -r requirements.txt",
        "pip install git+https://github.com/org/repo@0123456789abcdef0123456789abcdef01234567",
        "python3 -m uv sync --locked",
        "see user@mainframe.example",
    ],
)
def test_pinned_reference_is_not_flagged(text):
    assert references.mutable_references(text) == []


def test_mutable_reference_in_readme_recipe_and_config_is_reported(repo):
    edit(repo / SFT / "README.md", "```bash\n", "```bash\npip install renderers\n")
    data = _recipe(repo)
    data["provenance"]["upstream"] = "git+https://github.com/org/repo@main"
    _write_recipe(repo, data)
    config = repo / SFT / "configs" / "local-cpu-tiny-qwen3.json"
    edit(config, '"Smoke profile', '"uv run train; Smoke profile')
    found = problems_of(repo)
    assert f"{SFT}/README.md: unpinned install 'renderers' (pin it with ==)" in found
    assert f"{SFT}/recipe.yaml: mutable reference '@main'" in found
    assert any(p.startswith(f"{SFT}/configs/local-cpu-tiny-qwen3.json: 'uv run'") for p in found)


# --- last_validated and evidence ----------------------------------------------------------


# A date after every record's (the tests read the real records' dates, never hard-code them).
LATER = "2099-01-01"


def _profile(data, name):
    return next(p for p in data["profiles"] if p["name"] == name)


def test_last_validated_without_a_record_is_reported(repo):
    data = _recipe(repo)
    _profile(data, "local-cpu-tiny-qwen3")["last_validated"] = LATER  # newer than any record
    _write_recipe(repo, data)
    found = problems_of(repo)
    label = f"{SFT}/recipe.yaml: profiles[local-cpu-tiny-qwen3]"
    assert f"{label}: last_validated='{LATER}' without an evidence record" in found
    assert any(f"must be the newest profile date ('{LATER}')" in p for p in found)


def test_last_validated_with_a_failed_record_is_reported(repo):
    record_path = repo / SFT / "evidence" / "local-cpu-smollm2-lora.json"
    record = json.loads(record_path.read_text())
    record["passed"] = False
    record_path.write_text(json.dumps(record))
    date = _profile(_recipe(repo), "local-cpu-smollm2-lora")["last_validated"]
    assert problems_of(repo) == [
        f"{SFT}/recipe.yaml: profiles[local-cpu-smollm2-lora]: last_validated='{date}' but "
        "evidence 'evidence/local-cpu-smollm2-lora.json' has passed=False"
    ]


def test_last_validated_with_a_missing_record_file_is_reported(repo):
    (repo / OPD / "evidence" / "local-cpu-smollm2-teacher.json").unlink()
    date = _profile(_recipe(repo, OPD), "local-cpu-smollm2-teacher")["last_validated"]
    found = problems_of(repo)
    assert (
        f"{OPD}/recipe.yaml: profiles[local-cpu-smollm2-teacher]: last_validated='{date}' but "
        "evidence 'evidence/local-cpu-smollm2-teacher.json' does not exist"
    ) in found


def test_last_validated_with_a_record_of_another_date_is_reported(repo):
    data = _recipe(repo)
    recorded = json.loads((repo / SFT / "evidence" / "local-cpu-smollm2-full.json").read_text())
    _profile(data, "local-cpu-smollm2-full")["last_validated"] = LATER
    data["last_validated"] = LATER
    data["evidence"] = "evidence/local-cpu-smollm2-full.json"
    _write_recipe(repo, data)
    found = problems_of(repo)
    assert any(
        f"last_validated='{LATER}' but evidence" in p and f"is dated '{recorded['date']}'" in p
        for p in found
    )


def test_config_changed_after_qualification_is_reported(repo):
    problem = the_problem_after_editing(
        repo,
        f"{SFT}/configs/local-cpu-smollm2-lora.json",
        '"learning_rate": 0.0005',
        '"learning_rate": 0.001',
    )
    recorded = json.loads((repo / SFT / "evidence" / "local-cpu-smollm2-lora.json").read_text())
    assert f"has config_hash='{recorded['config_hash']}', the config now hashes to" in problem


def test_record_without_the_required_fields_is_reported(repo):
    record_path = repo / SFT / "evidence" / "local-cpu-smollm2-full.json"
    record = json.loads(record_path.read_text())
    del record["metrics"], record["image_digest"]
    record_path.write_text(json.dumps(record))
    [problem] = problems_of(repo)
    assert "lacks fields ['metrics', 'image_digest']" in problem


# --- repository-wide ----------------------------------------------------------------------


PLANNED = """
[[journey]]
name = "later"
folder = "recipes/later/journey"
extra = "sft"
entry_point = "recipes.later.journey.train"
smoke = "python -m recipes.later.journey.train"
status = "planned"
"""


def test_planned_journey_with_a_folder_is_not_checked(repo):
    with open(repo / "journeys.toml", "a") as f:
        f.write(PLANNED)
    (repo / "recipes" / "later" / "journey").mkdir(parents=True)
    (repo / "recipes" / "later" / "journey" / "train.py").write_text("broken(")
    assert [p for p in problems_of(repo) if "index is stale" not in p] == []


def test_landed_journey_without_its_folder_is_reported(repo):
    with open(repo / "journeys.toml", "a") as f:
        f.write(PLANNED.replace('status = "planned"', 'status = "landed"'))
    found = problems_of(repo)
    assert "recipes/later/journey: folder of landed journey 'later' does not exist" in found


def test_journey_folder_missing_from_journeys_toml_is_reported(repo):
    (repo / "recipes" / "extra").mkdir()
    (repo / "recipes" / "extra" / "recipe.yaml").write_text("id: extra\n")
    found = problems_of(repo)
    assert "recipes/extra/recipe.yaml: journey folder not listed in journeys.toml" in found


def test_stale_index_is_reported(repo):
    data = _recipe(repo)
    _profile(data, "local-cpu-tiny-qwen3")["hardware"] = "CPU, any"
    _write_recipe(repo, data)
    assert problems_of(repo) == [
        "recipes/README.md: index is stale; run `cortex-recipes catalog sync`"
    ]


def test_broken_journeys_toml_is_reported(repo):
    problem = the_problem_after_editing(
        repo, "journeys.toml", 'status = "landed"', 'status = "done"'
    )
    assert problem.startswith("journeys.toml: journey[0]: status='done'; accepted: landed, planned")


# --- command line -------------------------------------------------------------------------


def test_cli_prints_one_line_per_problem_and_exits_1(repo, capsys):
    edit(repo / SFT / "README.md", "## Troubleshooting", "## Known issues")
    edit(repo / OPD / "README.md", "## Hardware", "## Machines")
    assert cli.main(["validate", "--root", str(repo)]) == 1
    assert capsys.readouterr().out.splitlines() == [
        f"{SFT}/README.md: missing required section 'Troubleshooting' (a '## Troubleshooting' heading)",
        f"{OPD}/README.md: missing required section 'Hardware' (a '## Hardware' heading)",
    ]


def test_cli_exits_0_and_prints_nothing_on_a_clean_repository(repo, capsys):
    assert cli.main(["validate", "--root", str(repo)]) == 0
    assert capsys.readouterr().out == ""


def test_release_fails_on_evidence_recorded_before_code_digests(repo, caplog):
    record_path = repo / SFT / "evidence" / "local-cpu-smollm2-lora.json"
    record = json.loads(record_path.read_text())
    record.pop("code_digest", None)
    record_path.write_text(json.dumps(record))
    assert cli.main(["validate", "--root", str(repo)]) == 0
    assert "no code_digest" in caplog.text
    assert cli.main(["validate", "--root", str(repo), "--release"]) == 1
    summaries = [r.getMessage() for r in caplog.records if r.getMessage().startswith("validate:")]
    assert summaries and not any("no problems" in s for s in summaries)  # issue 35
    assert "evidence record(s) no longer describe the code" in summaries[-1]
