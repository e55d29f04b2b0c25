"""Write prime-rl rollout files for the trainer-adapter tests, with prime-rl's own structs.

Run inside a prime-rl environment (prime-rl 559b447, Python 3.12), from the repository root:

    $PRIMERL_PYTHON tests/data/primerl/make_rollout_files.py $PRIME_RL_CHECKOUT

It imports ``MicroBatch`` and ``TrainingSample`` from the checkout's
``src/prime_rl/transports/rollouts/types.py`` (only that file: it needs msgspec, not torch),
packs samples the way prime-rl's packer lays them out (samples back to back,
``sequence_lengths`` per sample, padding to ``pad_to_multiple_of`` appended to the last
sample with loss_mask False and token id 1) and encodes them with ``msgspec.msgpack`` exactly as
``FileSystemMicroBatchSender`` does (``rank_0.bin.tmp`` then rename). The samples are
synthetic, not sampled: Qwen3 chat-format prompts from the tiny-qwen3 tokenizer, seeded
completions and logprobs, group-relative advantages over the completion.
"""

import importlib.util
import json
import random
import sys
from pathlib import Path

import msgspec
from tokenizers import Tokenizer

HERE = Path(__file__).resolve().parent
TOKENIZER = (
    Path.home() / ".cache/cortex-recipes/models/tiny-qwen3/r1-transformers5.24.0/tokenizer.json"
)
PAD_TO_MULTIPLE_OF = 8


def load_types(checkout: Path):
    path = checkout / "src/prime_rl/transports/rollouts/types.py"
    spec = importlib.util.spec_from_file_location("prime_rl_rollout_types", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def samples(types, tokenizer, step: int, rng: random.Random):
    out = []
    for group in range(2):
        prompt = f"<|im_start|>user\nRepeat {7 * (step * 2 + group) + 3}<|im_end|>\n<|im_start|>assistant\n"
        prompt_ids = tokenizer.encode(prompt, add_special_tokens=False).ids
        rewards = [rng.random() for _ in range(2)]
        mean = sum(rewards) / len(rewards)
        for reward in rewards:
            completion = [rng.randrange(200, 5000) for _ in range(rng.randint(3, 6))] + [151645]
            logprobs = [-rng.uniform(0.05, 6.0) for _ in completion]
            n_p, n_c = len(prompt_ids), len(completion)
            out.append(
                types.TrainingSample(
                    token_ids=prompt_ids + completion,
                    mask=[False] * n_p + [True] * n_c,
                    logprobs=[0.0] * n_p + logprobs,
                    temperatures=[1.0] * (n_p + n_c),
                    env_name="cortex-echo",
                    advantages=[0.0] * n_p + [reward - mean] * n_c,
                )
            )
    return out


def pack(types, batch):
    fields = {
        k: []
        for k in (
            "input_ids",
            "loss_mask",
            "advantages",
            "inference_logprobs",
            "position_ids",
            "temperatures",
            "env_names",
        )
    }
    lengths = []
    for s in batch:
        fields["input_ids"] += s.token_ids
        fields["loss_mask"] += s.mask
        fields["advantages"] += s.advantages
        fields["inference_logprobs"] += s.logprobs
        fields["position_ids"] += list(range(len(s.token_ids)))
        fields["temperatures"] += s.temperatures
        fields["env_names"] += [s.env_name] * len(s.token_ids)
        lengths.append(len(s.token_ids))
    pad = (-len(fields["input_ids"])) % PAD_TO_MULTIPLE_OF
    fields["input_ids"] += [1] * pad
    fields["loss_mask"] += [False] * pad
    fields["advantages"] += [0.0] * pad
    fields["inference_logprobs"] += [0.0] * pad
    fields["position_ids"] += list(range(pad))
    fields["temperatures"] += [1.0] * pad
    fields["env_names"] += [batch[-1].env_name] * pad
    lengths[-1] += pad
    return types.MicroBatch(**fields, sequence_lengths=lengths, seq_lens=list(lengths))


def main(checkout: str) -> None:
    types = load_types(Path(checkout))
    tokenizer = Tokenizer.from_file(str(TOKENIZER))
    encoder = msgspec.msgpack.Encoder()
    rng = random.Random(16)
    written = []
    for step in (1, 2):
        batch = samples(types, tokenizer, step, rng)
        micro_batches = [pack(types, batch[:2]), pack(types, batch[2:])]
        path = HERE / "rollouts" / f"step_{step}" / "rank_0.bin"
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".bin.tmp")
        tmp.write_bytes(encoder.encode(micro_batches))
        tmp.rename(path)
        written.append(
            {
                "file": str(path.relative_to(HERE)),
                "bytes": path.stat().st_size,
                "samples": len(batch),
                "micro_batches": len(micro_batches),
            }
        )
    print(json.dumps(written, indent=2))


if __name__ == "__main__":
    main(sys.argv[1])
