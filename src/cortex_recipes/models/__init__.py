"""Model names -> local model directories: offline fixtures and locally present hub models."""

from cortex_recipes.models.resolve import (
    FIXTURE_MODELS,
    ModelNotAvailableError,
    build_fixture,
    load_causal_lm,
    load_tokenizer,
    resolve_model_path,
)

__all__ = [
    "FIXTURE_MODELS",
    "ModelNotAvailableError",
    "build_fixture",
    "load_causal_lm",
    "load_tokenizer",
    "resolve_model_path",
]
