"""forward_backward time of a GRPO-shaped batch (SmolLM2 + LoRA, 64 rows x 52 tokens, loss on
the last 8 completion positions) with the output projection over every position against only
the positions from the batch's first loss-carrying one (worker ``_split_logits``), in one run.

    python bench/split_logits.py
"""

import statistics
import time

import torch
from peft import LoraConfig, get_peft_model

from cortex_recipes.local import processors
from cortex_recipes.local.loss_schemas import Processing
from cortex_recipes.local.model_worker import TrainingWorker
from cortex_recipes.models import load_causal_lm

torch.set_num_threads(2)
m = load_causal_lm("smollm2-135m-instruct")
m = get_peft_model(
    m,
    LoraConfig(
        task_type="CAUSAL_LM",
        r=16,
        lora_alpha=32,
        target_modules=[
            "q_proj",
            "k_proj",
            "v_proj",
            "o_proj",
            "gate_proj",
            "up_proj",
            "down_proj",
        ],
    ),
)
m.train()
P = Processing.from_json({"loss_fn": "grpo", "post": ["compute_logprobs"], "config": {}})
g = torch.Generator().manual_seed(0)
ids = torch.randint(10, 30000, (64, 52), generator=g)
mask = torch.zeros(64, 52)
mask[:, 43:51] = 1
frame = {"kwargs": {"input_ids": ids}, "context": {"loss_mask": mask}}
res = {"whole": [], "split": []}
for _ in range(5):
    for name in res:
        w = TrainingWorker.__new__(TrainingWorker)
        w.model = m
        if name == "whole":
            w._split_logits = lambda k, f: None
        t0 = time.perf_counter()
        lp, ent = w._token_logprobs(
            frame["kwargs"], frame["context"], processors.shifted_labels(ids, None), P, frame
        )
        (-(lp * mask).sum() / mask.sum()).backward()
        m.zero_grad(set_to_none=True)
        res[name].append(time.perf_counter() - t0)
for k, v in res.items():
    print(k, [round(x, 2) for x in v], "median", round(statistics.median(v[1:]), 3))
print(
    "ratio split/whole",
    round(statistics.median(res["split"][1:]) / statistics.median(res["whole"][1:]), 3),
)
