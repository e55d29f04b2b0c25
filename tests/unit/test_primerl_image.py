"""ci/primerl_image.py: grpo's prime-rl variant is built from local clones at the pinned
commits, or skipped with one line that says why (CI has no GitHub)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.helpers import load_script

pytestmark = pytest.mark.unit

primerl_image = load_script("ci/primerl_image.py", "ci_primerl_image")
images = load_script("ci/images.py", "ci_images")


def git(*args, cwd):
    return subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
        cwd=cwd, check=True, capture_output=True, text=True,
    ).stdout.strip()  # fmt: skip


def clone_with_two_commits(path: Path) -> tuple[str, str]:
    path.mkdir(parents=True)
    git("init", "-q", cwd=path)
    (path / "f.txt").write_text("one")
    git("add", "f.txt", cwd=path)
    git("commit", "-qm", "one", cwd=path)
    first = git("rev-parse", "HEAD", cwd=path)
    (path / "f.txt").write_text("two")
    git("commit", "-qam", "two", cwd=path)
    return first, git("rev-parse", "HEAD", cwd=path)


def test_the_pins_are_the_requirements_files_commits():
    commits = primerl_image.pinned_commits()
    text = primerl_image.PINS.read_text()
    assert set(commits) == {"prime-rl", "verifiers"}
    for name, commit in commits.items():
        assert len(commit) == 40 and f"{name.split('-')[0]}" in text and commit in text
    assert commits["prime-rl"].startswith("559b447")
    assert commits["verifiers"].startswith("a60a606")


def test_a_pins_file_without_a_commit_is_refused(tmp_path):
    pins = tmp_path / "requirements-git.txt"
    pins.write_text("verifiers @ git+https://github.com/x/verifiers@" + "a" * 40 + "\n")
    with pytest.raises(ValueError, match=r"prime-rl"):
        primerl_image.pinned_commits(pins)


def test_no_clones_given_is_a_one_line_skip_with_the_fix():
    clones, why = primerl_image.find_clones(None, {"prime-rl": "a" * 40})
    assert clones == {} and "\n" not in why
    assert "--primerl-clones" in why and primerl_image.CLONES_ENV in why


def test_a_clone_without_the_pinned_commit_is_named(tmp_path):
    first, _ = clone_with_two_commits(tmp_path / "prime-rl")
    clones, why = primerl_image.find_clones(tmp_path, {"prime-rl": "b" * 40})
    assert clones == {} and "does not contain prime-rl's pinned commit bbbbbbbbbbbb" in why
    clones, why = primerl_image.find_clones(tmp_path, {"prime-rl": first, "verifiers": first})
    assert clones == {} and "verifiers is not a git clone" in why


def test_the_context_holds_each_clone_checked_out_at_its_pin(tmp_path):
    """An older pinned commit (not the clone's HEAD) is what lands in the build context."""
    first_p, _ = clone_with_two_commits(tmp_path / "src" / "prime-rl")
    _, head_v = clone_with_two_commits(tmp_path / "src" / "verifiers")
    commits = {"prime-rl": first_p, "verifiers": head_v}
    clones, why = primerl_image.find_clones(tmp_path / "src", commits)
    assert why == "" and set(clones) == {"prime-rl", "verifiers"}
    context = tmp_path / "context"
    primerl_image.make_context(clones, commits, context)
    assert git("rev-parse", "HEAD", cwd=context / "prime-rl") == first_p
    assert (context / "prime-rl" / "f.txt").read_text() == "one"
    assert (context / "verifiers" / "f.txt").read_text() == "two"


def test_images_py_skips_the_variant_in_one_line_without_clones(capsys):
    result = images.primerl_variant("podman", "cortex/grpo:pinned", "0.0.0", None)
    assert result["primerl_variant"].startswith("skipped: no local clones")
    assert "grpo-primerl skipped" in capsys.readouterr().err


def test_a_local_python_that_is_not_cpython_312_is_refused_naming_it(tmp_path):
    import os
    import sys

    with pytest.raises(ValueError, match=r"no CPython 3.12 at .*bin/python3.12"):
        primerl_image.check_python312(tmp_path / "missing")
    fake = tmp_path / "prefix"
    (fake / "bin").mkdir(parents=True)
    os.symlink(sys.executable, fake / "bin" / "python3.12")  # this interpreter: 3.11
    with pytest.raises(ValueError, match=r"--primerl-python312 .*prefix"):
        primerl_image.check_python312(fake)


def test_clones_asked_for_but_unusable_fail_instead_of_skipping(tmp_path, capsys):
    result = images.primerl_variant("podman", "cortex/grpo:pinned", "0.0.0", str(tmp_path))
    assert result["primerl_variant"] == "not built"
    (problem,) = result["primerl_problems"]
    assert problem.startswith(str(tmp_path)) and "is not a git clone" in problem
    assert "skipped" not in capsys.readouterr().err
