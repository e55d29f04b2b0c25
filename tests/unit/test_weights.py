"""Hub weight pins: the resolver, `models verify` and `models fetch --pin`, offline, on model
folders built in tmp_path in the Hugging Face cache layout (the download itself needs the Hub
and is replaced here by a stand-in that returns the local snapshot)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import huggingface_hub
import pytest

from cortex_recipes import cli, weights
from cortex_recipes.models import resolve_model_path

pytestmark = pytest.mark.unit

NAME = "demo-org/tiny"
REV = "0123456789abcdef0123456789abcdef01234567"
OTHER = "fedcba9876543210fedcba9876543210fedcba98"
WEIGHTS = b"not really safetensors, but bytes with a hash"


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def write_snapshot(cache: Path, name: str, revision: str, data: bytes = WEIGHTS) -> Path:
    """<cache>/models--org--name/snapshots/<revision>/ with config.json and the weights, and
    refs/main naming that revision (as huggingface_hub lays out its cache)."""
    repo = cache / f"models--{name.replace('/', '--')}"
    snapshot = repo / "snapshots" / revision
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    (snapshot / "model.safetensors").write_bytes(data)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(revision)
    return snapshot


def write_catalog(root: Path, **pin) -> Path:
    entry = {
        "name": NAME,
        "source": "hub",
        "family": "demo",
        "parameters": "1",
        "description": "a test model",
        "revision": REV,
        "weights": {"model.safetensors": _sha(WEIGHTS)},
        "pin_status": "pinned",
        "pin_note": "written by the test",
    }
    entry.update(pin)
    (root / "model-catalog").mkdir(parents=True, exist_ok=True)
    (root / "journeys.toml").write_text("")
    path = root / "model-catalog" / "models.json"
    path.write_text(json.dumps({"models": [entry]}))
    return root


@pytest.fixture
def repo(tmp_path, monkeypatch):
    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.delenv(weights.MODEL_DIRS_ENV, raising=False)
    root = write_catalog(tmp_path / "repo")
    monkeypatch.chdir(root)
    return root, cache


def test_pinned_weights_in_the_cache_verify(repo):
    root, cache = repo
    snapshot = write_snapshot(cache, NAME, REV)
    assert weights.verify(root, NAME) == (snapshot, [])
    assert cli.main(["models", "verify", NAME, "--root", str(root)]) == 0


def test_a_changed_weight_file_fails_closed_with_the_fetch_command(repo, capsys):
    root, cache = repo
    write_snapshot(cache, NAME, REV, data=b"other bytes")
    _, problems = weights.verify(root, NAME)
    assert len(problems) == 1
    assert f"has sha256 {_sha(b'other bytes')}, the pin says {_sha(WEIGHTS)}" in problems[0]
    assert f"`cortex-recipes models fetch {NAME}`" in problems[0]
    assert cli.main(["models", "verify", NAME, "--root", str(root)]) == 1
    assert "the pin says" in capsys.readouterr().out


def test_a_missing_weight_file_fails_closed(repo):
    root, cache = repo
    (write_snapshot(cache, NAME, REV) / "model.safetensors").unlink()
    _, problems = weights.verify(root, NAME)
    assert len(problems) == 1 and "model.safetensors is missing" in problems[0]


def test_only_another_revision_in_the_cache_is_no_weights(repo):
    root, cache = repo
    write_snapshot(cache, NAME, OTHER)
    folder, problems = weights.verify(root, NAME)
    assert folder is None
    assert f"no weights at revision {REV}" in problems[0]
    assert "the download only runs there" in problems[0]


def test_an_unverified_pin_fails_closed_with_the_pin_command(repo):
    root, cache = repo
    write_catalog(root, weights=None, pin_status="unverified", pin_note="hashes unknown")
    write_snapshot(cache, NAME, REV)
    folder, problems = weights.verify(root, NAME)
    assert folder is None and len(problems) == 1
    assert "pin_status='unverified'" in problems[0] and "hashes unknown" in problems[0]
    assert f"`cortex-recipes models fetch {NAME} --pin`" in problems[0]


@pytest.mark.parametrize(
    ("pin", "message"),
    [
        ({"revision": "main"}, "revision='main': a 40-hex commit"),
        ({"weights": {"model.safetensors": "abc"}}, "weights[model.safetensors]='abc': 64 hex"),
        ({"weights": None}, "pin_status='pinned' with revision="),
        ({"pin_status": "trusted"}, "pin_status='trusted': use one of"),
    ],
)
def test_malformed_pins_are_problems(repo, pin, message):
    root, _ = repo
    write_catalog(root, **pin)
    _, problems = weights.verify(root, NAME)
    assert any(message in p for p in problems), problems


def test_model_dirs_folder_is_checked_before_the_cache(repo, monkeypatch, tmp_path):
    root, cache = repo
    write_snapshot(cache, NAME, REV)
    local = tmp_path / "models" / NAME
    local.mkdir(parents=True)
    (local / "config.json").write_text("{}")
    (local / "model.safetensors").write_bytes(b"tampered")
    monkeypatch.setenv(weights.MODEL_DIRS_ENV, str(tmp_path / "models"))
    folder, problems = weights.verify(root, NAME)
    assert folder == local and "the pin says" in problems[0]


def test_the_resolver_prefers_the_pinned_revision_over_refs_main(repo):
    root, cache = repo
    pinned = write_snapshot(cache, NAME, REV)
    newer = write_snapshot(cache, NAME, OTHER)  # refs/main now names OTHER
    assert (cache / f"models--{NAME.replace('/', '--')}" / "refs" / "main").read_text() == OTHER
    assert resolve_model_path(NAME) == pinned
    import shutil

    shutil.rmtree(pinned)
    assert resolve_model_path(NAME) == newer  # falls back, with a warning


def test_fetch_pin_records_what_it_downloaded(repo, monkeypatch):
    root, cache = repo
    write_catalog(root, revision=None, weights=None, pin_status="unverified", pin_note="new")
    snapshot = write_snapshot(cache, NAME, REV)
    calls = []

    def download(repo_id, revision, local_dir=None):
        calls.append((repo_id, revision, local_dir))
        return str(snapshot)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", download)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    with pytest.raises(weights.WeightsError, match="revision is null"):
        weights.fetch(root, NAME)
    folder, problems = weights.fetch(root, NAME, pin=True)
    assert calls == [(NAME, "main", None)]
    assert (folder, problems) == (snapshot, [])
    pin = weights.get_pin(root, NAME)
    assert pin.complete and pin.revision == REV
    assert pin.weights == {"model.safetensors": _sha(WEIGHTS)}
    weights.fetch(root, NAME)
    assert calls[-1] == (NAME, REV, None)  # later fetches ask for exactly the pinned commit


def test_fetch_refuses_to_run_offline(repo, monkeypatch):
    root, _ = repo
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(weights.WeightsError, match="HF_HUB_OFFLINE is set"):
        weights.fetch(root, NAME)


def test_repository_hub_models_all_carry_a_pin():
    pins = weights.load_pins(Path(__file__).resolve().parents[2])
    assert pins, "the catalog names no hub model"
    for pin in pins.values():
        assert not pin.problems, pin.problems
        assert pin.revision is None or weights.REVISION_RE.match(pin.revision)
        if pin.status == "unverified":
            assert pin.note
