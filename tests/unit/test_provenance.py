"""Evidence tied to the code: the journey's files found from its imports, and stale records."""

from __future__ import annotations

import json
import shutil
import tomllib
from pathlib import Path

import pytest

from cortex_recipes.provenance import code_digest, code_files
from cortex_recipes.repo_checks.records import stale_evidence

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parents[2]


def names(root: Path, folder: str) -> set[str]:
    return {p.resolve().as_posix() for p in code_files(root, Path(folder))}


def test_the_sft_journey_reaches_the_backend_worker_and_its_processors():
    found = {str(p.relative_to(ROOT)) for p in code_files(ROOT, Path("recipes/sft/conversational"))}
    assert "recipes/sft/conversational/train.py" in found
    assert "src/cortex_recipes/supervision.py" in found  # imported
    assert "src/cortex_recipes/local/worker.py" in found  # started as python -m
    assert "src/cortex_recipes/local/processors.py" in found  # imported by the worker
    assert "src/cortex_recipes/primerl/trainer.py" not in found  # another journey's code


def test_the_digest_follows_imports_lazy_ones_and_module_strings(tmp_path):
    journey = tmp_path / "recipes" / "j"
    journey.mkdir(parents=True)
    (tmp_path / "recipes" / "__init__.py").write_text("")
    (journey / "__init__.py").write_text("")
    (journey / "train.py").write_text(
        "from recipes.j import helper\n"
        "def later():\n    from . import lazy\n"
        "WORKER = ['-m', 'recipes.j.worker']\n"
    )
    for name in ("helper", "lazy", "worker", "unused"):
        (journey / f"{name}.py").write_text(f"# {name}\n")
    (tmp_path / "recipes" / "other.py").write_text("# not imported\n")
    found = {p.name for p in code_files(tmp_path, Path("recipes/j"))}
    assert {"train.py", "helper.py", "lazy.py", "worker.py", "__init__.py"} <= found
    assert "other.py" not in found  # outside the journey folder and never imported
    before = code_digest(tmp_path, Path("recipes/j"))
    (tmp_path / "recipes" / "other.py").write_text("X = 1  # changed, still not imported\n")
    assert code_digest(tmp_path, Path("recipes/j")) == before
    (journey / "helper.py").write_text("X = 1\n")
    assert code_digest(tmp_path, Path("recipes/j")) != before


def sft_only_repo(tmp_path: Path) -> Path:
    shutil.copytree(ROOT / "recipes" / "sft", tmp_path / "recipes" / "sft")
    shutil.copy(ROOT / "recipes" / "__init__.py", tmp_path / "recipes" / "__init__.py")
    data = tomllib.loads((ROOT / "journeys.toml").read_text())
    sft = next(j for j in data["journey"] if j["name"] == "sft")
    (tmp_path / "journeys.toml").write_text(
        "[[journey]]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in sft.items())
    )
    return tmp_path


def test_stale_evidence_names_records_without_or_with_another_digest(tmp_path):
    root = sft_only_repo(tmp_path)
    evidence = root / "recipes" / "sft" / "conversational" / "evidence"
    current = code_digest(root, Path("recipes/sft/conversational"))
    records = sorted(evidence.glob("local-cpu-smollm2-*.json"))
    records = [r for r in records if not r.name.endswith(".failed.json")]
    assert len(records) >= 2
    fresh, old, *rest = records
    for path in rest:  # the other records are current too; only `old` is stale
        record = json.loads(path.read_text())
        record.update(code_digest=current, git_revision="abc123", code_digest_form="ast-1")
        path.write_text(json.dumps(record))
    for path, digest in ((fresh, current), (old, "0" * 64)):
        record = json.loads(path.read_text())
        record.update(code_digest=digest, git_revision="abc123", code_digest_form="ast-1")
        path.write_text(json.dumps(record))
    stale = stale_evidence(root)  # not a git checkout: revisions cannot be asked, not flagged
    assert stale == [
        f"recipes/sft/conversational/evidence/{old.name}: code_digest=000000000000 but the "
        f"journey's code is now {current[:12]}"
    ]


def test_qualify_stale_targets_the_stale_profiles_once_each(tmp_path):
    from cortex_recipes.qualify_command import stale_targets

    root = sft_only_repo(tmp_path)
    evidence = root / "recipes" / "sft" / "conversational" / "evidence"
    current = code_digest(root, Path("recipes/sft/conversational"))
    records = sorted(p for p in evidence.glob("*.json") if not p.name.endswith(".failed.json"))
    for path in records:
        record = json.loads(path.read_text())
        record.update(code_digest=current, git_revision="abc123", code_digest_form="ast-1")
        path.write_text(json.dumps(record))
    assert stale_targets(root) == []
    stale = records[0]
    record = json.loads(stale.read_text())
    record.update(
        code_digest="0" * 64, git_revision=None, code_digest_form="ast-1"
    )  # stale for two reasons
    stale.write_text(json.dumps(record))
    assert len(stale_evidence(root)) == 2
    assert stale_targets(root) == [("sft", record["profile"])]


def test_qualify_stale_with_nothing_stale_runs_nothing(tmp_path, capsys):
    from cortex_recipes.cli import main

    root = sft_only_repo(tmp_path)
    evidence = root / "recipes" / "sft" / "conversational" / "evidence"
    current = code_digest(root, Path("recipes/sft/conversational"))
    for path in evidence.glob("*.json"):
        record = json.loads(path.read_text())
        record.update(code_digest=current, git_revision="abc123", code_digest_form="ast-1")
        path.write_text(json.dumps(record))
    assert main(["qualify", "--stale", "--root", str(root)]) == 0
    assert "no stale evidence" in capsys.readouterr().out
    assert main(["qualify", "sft", "--stale", "--root", str(root)]) == 2


def test_a_digest_of_another_checkout_reads_that_checkouts_library(tmp_path):
    """`validate --release --root DIR` must see DIR's src/, not the imported package's: a
    change to the library in DIR changes DIR's digest only (issue 35)."""
    shutil.copytree(ROOT / "recipes" / "sft", tmp_path / "recipes" / "sft")
    shutil.copy(ROOT / "recipes" / "__init__.py", tmp_path / "recipes" / "__init__.py")
    shutil.copytree(
        ROOT / "src" / "cortex_recipes",
        tmp_path / "src" / "cortex_recipes",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    folder = Path("recipes/sft/conversational")
    assert code_digest(tmp_path, folder) == code_digest(ROOT, folder)
    frames = tmp_path / "src" / "cortex_recipes" / "frames.py"
    frames.write_text(frames.read_text() + "\nCHANGED_IN_THE_OTHER_CHECKOUT = 1\n")
    assert code_digest(tmp_path, folder) != code_digest(ROOT, folder)
    assert (tmp_path / "src" / "cortex_recipes" / "frames.py") in code_files(tmp_path, folder)


FORM_ONLY = [
    ("a comment", lambda s: s.replace("def f(a, b):", "def f(a, b):  # adds", 1)),
    ("a docstring", lambda s: s.replace("def f(a, b):\n", 'def f(a, b):\n    """Adds."""\n', 1)),
    ("a module docstring", lambda s: '"""The module."""\n' + s),
    (
        "reflowed lines",
        lambda s: s.replace("return a + b", "return (\n        a\n        + b\n    )"),
    ),
    ("quotes", lambda s: s.replace("'x'", '"x"')),
    ("blank lines", lambda s: s.replace("\n\n", "\n\n\n\n")),
]
BEHAVIOUR = [
    ("an operator", lambda s: s.replace("a + b", "a - b")),
    ("a constant", lambda s: s.replace("'x'", "'y'")),
    ("a name", lambda s: s.replace("NAME", "OTHER")),
    ("a statement", lambda s: s.replace("return a + b", "b += 1\n    return a + b")),
    ("a default", lambda s: s.replace("def f(a, b):", "def f(a, b=2):")),
]
SOURCE = "NAME = 'x'\n\n\ndef f(a, b):\n    return a + b\n"


def _digest_of(tmp_path: Path, source: str) -> str:
    journey = tmp_path / "recipes" / "j"
    journey.mkdir(parents=True, exist_ok=True)
    (tmp_path / "recipes" / "__init__.py").write_text("")
    (journey / "__init__.py").write_text("")
    (journey / "train.py").write_text(source)
    return code_digest(tmp_path, Path("recipes/j"))


@pytest.mark.parametrize(("what", "edit"), FORM_ONLY, ids=[w for w, _ in FORM_ONLY])
def test_a_tidy_up_keeps_the_digest(tmp_path, what, edit):
    assert edit(SOURCE) != SOURCE
    assert _digest_of(tmp_path, edit(SOURCE)) == _digest_of(tmp_path / "b", SOURCE), what


@pytest.mark.parametrize(("what", "edit"), BEHAVIOUR, ids=[w for w, _ in BEHAVIOUR])
def test_a_change_of_behaviour_changes_the_digest(tmp_path, what, edit):
    assert edit(SOURCE) != SOURCE
    assert _digest_of(tmp_path, edit(SOURCE)) != _digest_of(tmp_path / "b", SOURCE), what


def test_restamp_only_a_byte_record_of_todays_code(tmp_path):
    """A record with a byte digest of exactly today's code gets the form-blind digest and its
    byte digest kept; one whose byte digest is of other code stays stale."""
    import json

    from cortex_recipes.provenance import DIGEST_FORM, byte_digest
    from cortex_recipes.repo_checks.records import restamp, stale_evidence

    root = sft_only_repo(tmp_path)
    folder = Path("recipes/sft/conversational")
    records = sorted((root / folder / "evidence").glob("*.json"))
    records = [p for p in records if not p.name.endswith(".failed.json")]
    assert len(records) >= 2
    for path in records:
        record = json.loads(path.read_text())
        record.pop("code_digest_form", None)
        record.update(code_digest=byte_digest(root, folder), git_revision="abc123")
        path.write_text(json.dumps(record))
    other = json.loads(records[0].read_text())
    other["code_digest"] = "0" * 64
    records[0].write_text(json.dumps(other))
    done = restamp(root)
    assert done == sorted(f"{folder.as_posix()}/evidence/{p.name}" for p in records[1:])
    for path in records[1:]:
        record = json.loads(path.read_text())
        assert record["code_digest"] == code_digest(root, folder)
        assert record["code_digest_form"] == DIGEST_FORM
        assert record["code_digest_bytes"] == byte_digest(root, folder)
    assert json.loads(records[0].read_text())["code_digest"] == "0" * 64
    assert any("code_digest" in line and records[0].name in line for line in stale_evidence(root))


def test_a_revision_a_shallow_clone_lacks_is_unknown_not_absent(tmp_path):
    """`validate --release` in a shallow CI clone: an old record's commit is outside the
    clone's history, which says nothing about whether it is in the project's; a full clone
    still finds a made-up commit absent."""
    import subprocess

    from cortex_recipes.repo_checks.records import _revision_known

    def git(*args, cwd=tmp_path / "full"):
        subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True)

    (tmp_path / "full").mkdir()
    git("init", "-q")
    revisions = []
    for n in range(3):
        (tmp_path / "full" / "f").write_text(str(n))
        git("add", "f")
        git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", f"c{n}")
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=tmp_path / "full",
                             capture_output=True, text=True, check=True)  # fmt: skip
        revisions.append(out.stdout.strip())
    git("clone", "-q", "--depth", "1", f"file://{tmp_path / 'full'}", str(tmp_path / "shallow"),
        cwd=tmp_path)  # fmt: skip
    made_up = "0123456789abcdef0123456789abcdef01234567"
    assert _revision_known(tmp_path / "full", revisions[0]) is True
    assert _revision_known(tmp_path / "full", made_up + "+dirty") is False
    assert _revision_known(tmp_path / "shallow", revisions[2]) is True
    assert _revision_known(tmp_path / "shallow", revisions[0]) is None
    assert _revision_known(tmp_path / "shallow", made_up) is None
