"""The import-time stand-ins for prime-rl's orchestrator: used only when the real package fails."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from cortex_recipes.primerl import launch

pytestmark = pytest.mark.unit
STANDINS = launch.STANDINS


def probe(code: str, path: Path | None = None) -> dict:
    """Run ``code`` after install_needed() in a fresh interpreter; it prints one JSON line."""
    prelude = textwrap.dedent(
        f"""
        import json, sys
        sys.path.insert(0, {str(STANDINS.parent)!r})
        {"sys.path.insert(0, " + repr(str(path)) + ")" if path else ""}
        import import_standins
        installed = import_standins.install_needed()
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", prelude + textwrap.dedent(code)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_missing_packages_get_stand_ins_that_import_and_refuse_to_run():
    result = probe(
        """
        from torchtitan.distributed.expert_parallel import ExpertParallel, expert_parallel
        from torchtitan.experiments.kernels.moe import indices
        from ring_flash_attn.utils import AllGatherComm, get_default_args
        from ring_flash_attn import substitute_hf_flash_attn

        @expert_parallel
        def experts(x):
            return x

        class Plan(ExpertParallel):  # prime-rl subclasses it at import time
            pass

        errors = []
        for call in (experts, indices.generate_permute_indices, get_default_args,
                     substitute_hf_flash_attn, Plan, AllGatherComm):
            try:
                call(1)
            except NotImplementedError as exc:
                errors.append(str(exc))
        print(json.dumps({"installed": installed, "errors": errors}))
        """
    )
    assert result["installed"] == ["torchtitan", "ring_flash_attn"]
    assert len(result["errors"]) == 6
    assert all("import-time stand-in" in e for e in result["errors"])
    assert (
        "torchtitan.distributed.expert_parallel.expert_parallel('experts')" in result["errors"][0]
    )


def test_a_real_package_with_every_name_is_left_alone(tmp_path):
    for module, names in {
        "torchtitan/distributed/expert_parallel.py": ["ExpertParallel", "expert_parallel",
            "set_token_group_alignment_size_m", "TOKEN_GROUP_ALIGN_SIZE_M"],
        "torchtitan/distributed/utils.py": ["clip_grad_norm_"],
        "torchtitan/experiments/kernels/moe/indices.py": ["generate_permute_indices"],
    }.items():  # fmt: skip
        file = tmp_path / module
        file.parent.mkdir(parents=True, exist_ok=True)
        file.write_text("".join(f"{n} = 'real'\n" for n in names))
    result = probe(
        """
        from torchtitan.distributed.utils import clip_grad_norm_
        print(json.dumps({"installed": installed, "value": clip_grad_norm_}))
        """,
        path=tmp_path,
    )
    assert result == {"installed": ["ring_flash_attn"], "value": "real"}


def test_a_real_package_missing_a_name_is_replaced_whole(tmp_path):
    # PyPI torchtitan 0.3.0 imports but lacks the 23e4dfc names prime-rl uses.
    (tmp_path / "torchtitan" / "distributed").mkdir(parents=True)
    (tmp_path / "torchtitan" / "distributed" / "expert_parallel.py").write_text(
        "ExpertParallel = 1\n"
    )
    result = probe(
        """
        import torchtitan.distributed.expert_parallel as ep
        print(json.dumps({"installed": installed,
                          "standin": getattr(ep, "__cortex_recipes_standin__", False)}))
        """,
        path=tmp_path,
    )
    assert result == {"installed": ["torchtitan", "ring_flash_attn"], "standin": True}


def test_primerl_python_names_the_variable_and_what_is_missing(tmp_path, monkeypatch):
    monkeypatch.delenv(launch.ENV_VAR, raising=False)
    with pytest.raises(launch.PrimeRLNotFound, match=launch.ENV_VAR):
        launch.primerl_python()
    python = tmp_path / "bin" / "python"
    python.parent.mkdir()
    python.write_text("")
    with pytest.raises(launch.PrimeRLNotFound, match="no 'orchestrator' script"):
        launch.primerl_python(python)
    for script in ("orchestrator", "env-server"):
        (python.parent / script).write_text("")
    assert launch.primerl_python(python) == python
    assert launch.script_command(python, "orchestrator", "@", "o.toml")[1:] == [
        str(STANDINS),
        "orchestrator",
        "@",
        "o.toml",
    ]
