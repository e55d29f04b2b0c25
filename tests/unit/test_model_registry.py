from pathlib import Path

import huggingface_hub
import pytest

from cortex_recipes.models import ModelNotAvailableError, build_fixture, resolve_model_path
from cortex_recipes.models.cache import COMPLETE_MARKER, build_once

pytestmark = pytest.mark.unit


@pytest.fixture
def empty_model_search(tmp_path, monkeypatch):
    monkeypatch.setenv("CORTEX_RECIPES_MODEL_DIRS", str(tmp_path / "models"))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    return tmp_path


def test_absent_hub_model_fails_with_instructions(empty_model_search):
    with pytest.raises(ModelNotAvailableError) as info:
        resolve_model_path("Qwen/Qwen3-0.6B")
    message = str(info.value)
    assert "model_name='Qwen/Qwen3-0.6B'" in message
    assert "`cortex-recipes models fetch Qwen/Qwen3-0.6B`" in message
    assert "CORTEX_RECIPES_MODEL_DIRS" in message
    assert "tiny-qwen3" in message


def test_hub_model_resolves_from_model_dirs(empty_model_search):
    model_dir = empty_model_search / "models" / "Qwen" / "Qwen3-0.6B"
    model_dir.mkdir(parents=True)
    (model_dir / "config.json").write_text("{}")
    assert resolve_model_path("Qwen/Qwen3-0.6B") == model_dir


def test_hub_model_resolves_from_hub_cache_ref(empty_model_search):
    repo = empty_model_search / "hub" / "models--Qwen--Qwen3-0.6B"
    for rev in ("aaa", "bbb"):
        (repo / "snapshots" / rev).mkdir(parents=True)
        (repo / "snapshots" / rev / "config.json").write_text("{}")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("bbb")
    assert resolve_model_path("Qwen/Qwen3-0.6B") == repo / "snapshots" / "bbb"


def test_hub_cache_dir_without_config_is_not_a_model(empty_model_search):
    (empty_model_search / "hub" / "models--Qwen--Qwen3-0.6B" / "snapshots" / "x").mkdir(
        parents=True
    )
    with pytest.raises(ModelNotAvailableError):
        resolve_model_path("Qwen/Qwen3-0.6B")


def test_unknown_fixture_name_is_rejected(tmp_path):
    with pytest.raises(ModelNotAvailableError, match="fixtures are tiny-qwen3"):
        build_fixture("tiny-llama", root=tmp_path)


def test_failed_build_leaves_nothing_behind(tmp_path):
    target = tmp_path / "fixture"

    def broken(out: Path) -> None:
        (out / "half.bin").write_bytes(b"x")
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        build_once(target, broken)
    assert not target.exists()
    assert [p.name for p in tmp_path.iterdir()] == [".fixture.lock"]


def test_complete_build_is_reused_not_rebuilt(tmp_path):
    calls = []

    def build(out: Path) -> None:
        calls.append(out)
        (out / "weights.bin").write_bytes(b"w")

    first = build_once(tmp_path / "fixture", build)
    second = build_once(tmp_path / "fixture", build)
    assert first == second and len(calls) == 1
    assert (first / COMPLETE_MARKER).is_file() and (first / "weights.bin").read_bytes() == b"w"
