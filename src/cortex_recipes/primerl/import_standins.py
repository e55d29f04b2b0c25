"""Run one of prime-rl's console scripts, with import-time stand-ins where a CPU host lacks them.

    <prime-rl python> import_standins.py orchestrator @ orch.toml
    <prime-rl python> import_standins.py env-server @ env.toml

Why this exists: prime-rl's orchestrator (commit 559b447) imports ``prime_rl.trainer.model`` at
module level only for ``setup_tokenizer``. That import pulls in two packages the orchestrator
never calls:

- ``torchtitan`` at the API of revision 23e4dfc (``expert_parallel``,
  ``set_token_group_alignment_size_m``, ``experiments.kernels.moe.indices``), which no PyPI
  release has; the PyPI 0.3.0 wheel fails to import (``spmd_types``) or lacks those names;
- ``ring_flash_attn``, which imports ``flash_attn``, an sdist-only CUDA build that fails on a
  machine without a CUDA toolchain.

For each of the two, this script first tries the real package. Only when that import fails (or
lacks a name prime-rl imports) does it put a stand-in module in ``sys.modules``: the names
exist so that ``import`` succeeds, and calling any of them raises ``NotImplementedError``
naming the stand-in. A machine with the real packages installed runs prime-rl unchanged, with
no stand-in. Which stand-ins were installed is printed on stderr.

This file runs under prime-rl's own Python 3.12 environment, which does not have this project
installed: it uses the standard library only and is passed to that Python by path
(``cortex_recipes.primerl.launch`` does so).
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.metadata
import sys
import types

# Module -> names prime-rl imports from it at module level somewhere under
# prime_rl.trainer.model (grep of prime-rl 559b447 for torchtitan / ring_flash_attn imports).
TORCHTITAN = {
    "torchtitan.distributed.expert_parallel": (
        "ExpertParallel",
        "expert_parallel",
        "set_token_group_alignment_size_m",
        "TOKEN_GROUP_ALIGN_SIZE_M",
    ),
    "torchtitan.distributed.utils": ("clip_grad_norm_",),
    "torchtitan.experiments.kernels.moe.indices": ("generate_permute_indices",),
}
RING_FLASH_ATTN = {
    "ring_flash_attn": (
        "llama3_flash_attn_varlen_func",
        "substitute_hf_flash_attn",
        "update_ring_flash_attn_params",
    ),
    "ring_flash_attn.utils": ("AllGatherComm", "get_default_args"),
    "ring_flash_attn.adapters.hf_adapter": ("DATA_PARAMS",),
}
# Names used as decorators or base classes at import time: they must behave as such.
DECORATORS = {"expert_parallel"}
CLASSES = {"ExpertParallel", "AllGatherComm"}
CONSTANTS = {"TOKEN_GROUP_ALIGN_SIZE_M": 8, "DATA_PARAMS": {}}


def _missing(qualname: str):
    def call(*args, **kwargs):
        raise NotImplementedError(
            f"{qualname} is an import-time stand-in (cortex_recipes/primerl/import_standins.py): "
            "the real package is not installed on this machine"
        )

    call.__name__ = qualname.rsplit(".", 1)[-1]
    return call


def _stand_in_value(module: str, name: str):
    qualname = f"{module}.{name}"
    if name in CONSTANTS:
        return CONSTANTS[name]
    if name in DECORATORS:
        # Decorating a function must succeed; calling the result must not pretend to work.
        return lambda fn: _missing(f"{qualname}({getattr(fn, '__name__', fn)!r})")
    if name in CLASSES:
        return type(name, (), {"__init__": lambda self, *a, **k: _missing(qualname)()})
    return _missing(qualname)


def _real_import_works(spec: dict[str, tuple[str, ...]]) -> bool:
    try:
        for module, names in spec.items():
            loaded = importlib.import_module(module)
            if any(not hasattr(loaded, name) for name in names):
                return False
    except Exception:  # noqa: BLE001 - any failure means the real package is unusable here
        return False
    return True


def _install(top: str, spec: dict[str, tuple[str, ...]]) -> None:
    for name in [m for m in sys.modules if m == top or m.startswith(top + ".")]:
        del sys.modules[name]  # drop what a failed real import left half-initialised
    for module, names in spec.items():
        parts = module.split(".")
        for depth in range(1, len(parts) + 1):
            package = ".".join(parts[:depth])
            if package not in sys.modules:
                stub = types.ModuleType(package, f"import-time stand-in for {package}")
                stub.__path__ = []  # a package, so submodules can hang off it
                stub.__cortex_recipes_standin__ = True
                sys.modules[package] = stub
                if depth > 1:
                    setattr(sys.modules[".".join(parts[: depth - 1])], parts[depth - 1], stub)
        for name in names:
            setattr(sys.modules[module], name, _stand_in_value(module, name))


def install_needed() -> list[str]:
    """Install the stand-ins whose real package does not import; return their names."""
    # prime-rl's own transformers patch, which the real ring_flash_attn needs first; without
    # prime-rl the probe below decides on its own.
    with contextlib.suppress(Exception):
        importlib.import_module("prime_rl._compat")
    installed = []
    for top, spec in (("torchtitan", TORCHTITAN), ("ring_flash_attn", RING_FLASH_ATTN)):
        if not _real_import_works(spec):
            _install(top, spec)
            installed.append(top)
    return installed


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: import_standins.py <prime-rl console script> [args...]", file=sys.stderr)
        return 2
    script, args = argv[0], argv[1:]
    entry = [
        e for e in importlib.metadata.entry_points(group="console_scripts") if e.name == script
    ]
    if not entry:
        print(f"no console script {script!r} in this environment", file=sys.stderr)
        return 2
    installed = install_needed()
    if installed:
        print(f"import-time stand-ins in use: {', '.join(installed)}", file=sys.stderr)
    sys.argv = [script, *args]
    result = entry[0].load()()
    return result if isinstance(result, int) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
