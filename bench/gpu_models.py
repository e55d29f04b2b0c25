"""Build the random-init models the GPU check needs, from the offline Qwen3 tokenizer.

- ``qwen3-0.6b-shape``: Qwen3-0.6B's shape (hidden 1024, 28 layers, 16 query / 8 key-value
  heads of head_dim 128, intermediate 3072, 151,936 vocab, tied embeddings; 596M parameters)
  with random weights. No weights are downloaded: speed depends on the shape, not the values.
- ``tiny-qwen3-teacher``: tiny-qwen3's shape with another seed, the teacher of the on-policy
  distillation smoke on the GPU machine (the CPU smoke's SmolLM2 GGUF is 93 MB, more than the
  64 MiB the GPU machine's working tree may carry).
- the ``tiny-qwen3`` fixture itself, built into the fixture cache if it is not there yet.

Prints ``{"name": "directory", ...}`` as JSON.

    python bench/gpu_models.py --out /tmp/gpu-models            # all three
    python bench/gpu_models.py --out /tmp/gpu-models --skip-0.6b
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from cortex_recipes.models import resolve_model_path
from cortex_recipes.models.cache import build_once
from cortex_recipes.models.fixtures import TINY_QWEN3, TinyQwen3Shape, build_tiny_qwen3

# Qwen/Qwen3-0.6B config.json: hidden_size 1024, num_hidden_layers 28, num_attention_heads 16,
# num_key_value_heads 8, head_dim 128, intermediate_size 3072, vocab_size 151936,
# max_position_embeddings 40960, tie_word_embeddings true, rope_theta 1e6, rms_norm_eps 1e-6.
QWEN3_0_6B = TinyQwen3Shape(
    hidden_size=1024,
    num_hidden_layers=28,
    num_attention_heads=16,
    num_key_value_heads=8,
    head_dim=128,
    intermediate_size=3072,
    vocab_size=151_936,
    max_position_embeddings=40_960,
    seed=0,
)
QWEN3_0_6B_ROPE_THETA = 1_000_000.0
TEACHER = TinyQwen3Shape(seed=1)


def build_qwen3_0_6b_shape(out: Path) -> None:
    build_tiny_qwen3(out, shape=QWEN3_0_6B)
    # TinyQwen3Shape has no rope base; set Qwen3-0.6B's in the saved config (it changes no
    # tensor shape, only the rotary frequencies).
    config_path = out / "config.json"
    config = json.loads(config_path.read_text())
    if isinstance(config.get("rope_parameters"), dict):
        config["rope_parameters"]["rope_theta"] = QWEN3_0_6B_ROPE_THETA
    else:
        config["rope_theta"] = QWEN3_0_6B_ROPE_THETA
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True))


def build_teacher(out: Path) -> None:
    build_tiny_qwen3(out, shape=TEACHER)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, required=True, help="directory to build into")
    parser.add_argument(
        "--skip-0.6b", dest="skip_large", action="store_true", help="build the small ones only"
    )
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    built = {TINY_QWEN3: str(resolve_model_path(TINY_QWEN3))}
    built["tiny-qwen3-teacher"] = str(build_once(args.out / "tiny-qwen3-teacher", build_teacher))
    if not args.skip_large:
        built["qwen3-0.6b-shape"] = str(
            build_once(args.out / "qwen3-0.6b-shape", build_qwen3_0_6b_shape)
        )
    print(json.dumps(built, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
