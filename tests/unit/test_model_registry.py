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


def test_a_baked_build_is_used_and_nothing_is_written_into_the_baked_cache(tmp_path, monkeypatch):
    """An image's fixtures are a read-only baked cache: a finished build there is used as it
    is; a build that is not there lands in the writable cache, never in the baked one."""
    baked, writable = tmp_path / "baked", tmp_path / "writable"
    monkeypatch.setenv("CORTEX_RECIPES_CACHE", str(writable))
    monkeypatch.setenv("CORTEX_RECIPES_BAKED_CACHE", f"{tmp_path / 'absent'}:{baked}")
    (baked / "models" / "fixture").mkdir(parents=True)
    (baked / "models" / "fixture" / COMPLETE_MARKER).write_text("")
    (baked / "models" / "half").mkdir(parents=True)  # no marker: not a finished build
    calls = []

    def build(out: Path) -> None:
        calls.append(out)
        (out / "weights.bin").write_bytes(b"w")

    for path in (baked, *baked.rglob("*")):
        path.chmod(0o555 if path.is_dir() else 0o444)
    try:
        assert build_once(writable / "models" / "fixture", build) == baked / "models" / "fixture"
        assert calls == []
        derived = build_once(writable / "models" / "half", build)
        other = build_once(tmp_path / "elsewhere", build)  # not under the cache root
    finally:
        for path in (baked, *baked.rglob("*")):
            path.chmod(0o755 if path.is_dir() else 0o644)
    assert derived == writable / "models" / "half" and (derived / "weights.bin").is_file()
    assert other == tmp_path / "elsewhere" and len(calls) == 2
    assert sorted(p.name for p in (baked / "models").iterdir()) == ["fixture", "half"]
    assert list((baked / "models" / "half").iterdir()) == []
