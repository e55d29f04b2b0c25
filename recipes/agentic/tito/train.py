"""Token-in/token-out agentic RL: multi-turn tool use with exact token ids and action masks.

    python -m recipes.agentic.tito.train                       # CPU profile (tiny-qwen3)
    python -m recipes.agentic.tito.train rl_steps=1 warm_start_steps=20   # smoke

1. Check that the renderer extends the environment's turns token for token (reject otherwise).
2. Warm start: SFT on tool-use demonstrations (the SFT journey's library), so the model really
   emits ``facts_lookup`` calls. Then save checkpoint ``step_0``.
3. RL: episodes run through verifiers' ``TrainClient`` -> this repo's ``/inference/v1/generate``
   gateway -> the sampling sub-job's token-id ``generate``. Each turn's prompt bridges onto
   the previous prompt + completion ids; tool results are appended as context. The trace's
   ``sampled_mask`` is the action mask: ``grpo`` trains only on the tokens the model sampled,
   with the sampler's logprobs as ``old_log_probs_shifted``. Then step and weight sync.
4. Checkpoints every ``ckpt.interval`` steps (resumable save + state) in the run folder
   ``runs/tito/<run_name>/`` (cortex_recipes.run); rerunning the command resumes.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import sys
import time

import chz
import verifiers.v1 as vf
from verifiers.v1.clients import resolve_client
from verifiers.v1.configs.client import TrainClientConfig

from cortex_recipes import completions, frames, profiles, progress
from cortex_recipes.envs.glossary import (
    GlossaryTaskset,
    GlossaryToolset,
    glossary_config,
    load_facts,
    tool_specs,
)
from cortex_recipes.models import load_tokenizer, resolve_model_path
from cortex_recipes.run import RunConfig, Trainer, profile_field
from cortex_recipes.supervision import collate, make_renderer
from cortex_recipes.tito.episode import run_episode
from cortex_recipes.tito.gateway import Gateway, create_gateway_app, sdk_generate
from cortex_recipes.tito.prefix import check_linear_history
from cortex_recipes.tito.profile import TitoProfile, load_tito_profile
from cortex_recipes.tito.training import demonstration, demonstrations, episode_frame, wire_tools

log = logging.getLogger("recipes.agentic.tito")
DEFAULT_PROFILE = "recipes/agentic/tito/configs/local-cpu-tiny-qwen3.json"
GATEWAY_KEY_ENV = (
    "CORTEX_TITO_GATEWAY_KEY"  # the loopback gateway needs no key; the client wants a name
)


@chz.chz
class Config(RunConfig):
    profile: str = profile_field(DEFAULT_PROFILE)
    rl_steps: int = chz.field(default=0, doc="0: the profile's rl.steps")
    rollouts_rate: float = completions.rate_field()
    warm_start_steps: int = chz.field(default=-1, doc="< 0: the profile's warm_start.steps")
    stop_after_step: int = chz.field(
        default=0, doc="> 0: stop after this RL step (an interruption, for resume checks)"
    )


def main(config: Config) -> dict:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    profile = load_tito_profile(config.profile, config.overrides)
    run = config.open_run("tito", profile)
    if run.finished:
        return run.finished
    resume = run.resume

    tokenizer = load_tokenizer(profile.model)
    renderer = make_renderer(tokenizer, profile.renderer)
    facts = load_facts("tasks", profile.tasks, profile.recipe_dir)
    glossary = glossary_config(facts)
    toolset = GlossaryToolset(glossary.task.tools)
    tools = tool_specs(toolset)
    tasks = GlossaryTaskset(glossary).load()
    history_check = check_linear_history(
        renderer, demonstration(*next(iter(facts.items()))), wire_tools(tools)
    )  # before any training: refuse templates that cannot extend turns exactly
    pad_id = frames.pad_id(tokenizer)
    rl_steps = config.rl_steps or profile.rl.steps
    seed = profile.seed
    written = completions.RolloutWriter(run.path, tokenizer, rate=config.rollouts_rate)
    started = time.monotonic()

    with run.connect(config.connection) as client:
        trainer = Trainer.start(client, profile.sub_jobs(), run, weight_format="hf")
        job_id = trainer.job_id
        if resume is not None:
            trainer.load(resume)  # and sync
            state = resume["state"]
        else:
            state = {
                "warm_start": warm_start(
                    trainer, profile, config, tokenizer, renderer, tools, facts, pad_id
                )
            }
            trainer.sync()
            trainer.save_resumable(0, {"state": state})

        app = create_gateway_app(
            sdk_generate(client, job_id),
            model=profile.model,
            max_model_len=profile.max_seq_len,
            base_seed=seed,
        )
        os.environ.setdefault(GATEWAY_KEY_ENV, "local")
        with Gateway(app) as gateway:
            train_client = resolve_client(
                TrainClientConfig(
                    base_url=gateway.base_url,
                    api_key_var=GATEWAY_KEY_ENV,
                    renderer=renderer_config(profile),
                    renderer_model_name=str(resolve_model_path(profile.model)),
                )
            )

            loop = asyncio.new_event_loop()  # one loop: the client's connections live on it

            def play(task, session: str, temperature: float):
                sampling = vf.SamplingConfig(
                    temperature=temperature, max_tokens=profile.rl.max_tokens
                )
                return loop.run_until_complete(
                    run_episode(
                        train_client,
                        model=profile.model,
                        task=task,
                        toolset=toolset,
                        tools=tools,
                        sampling=sampling,
                        session_id=session,
                        max_turns=profile.rl.max_turns,
                    )
                )

            if "eval_before_rl" not in state:
                state["eval_before_rl"] = greedy_eval(play, tasks, seed)
                log.info("eval after warm start: %s", state["eval_before_rl"])
            first = resume["step"] + 1 if resume else 1
            run.track_steps(rl_steps)
            for step in range(first, rl_steps + 1):
                t0 = time.monotonic()
                chosen = pick_tasks(tasks, profile.rl.tasks_per_step, seed, step)
                groups = [
                    [
                        play(task, f"{seed}-{step}-{task.data.idx}-{k}", profile.rl.temperature)
                        for k in range(profile.rl.group_size)
                    ]
                    for task in chosen
                ]
                for k, episodes in enumerate(groups):  # one task's episodes, this step's policy
                    written.write_episodes(
                        step=step, group=k, policy_version=step - 1, episodes=episodes
                    )
                frame, stats = episode_frame(groups, pad_id, {"eps_clip": profile.rl.eps_clip})
                result, _ = trainer.train_step(frame, learning_rate=profile.rl.learning_rate)
                trainer.sync()
                record = {
                    "step": step,
                    "loss": result["avg_loss"],
                    **stats,
                    "mismatch_kl/mean": result["metrics"].get("approx_kl"),
                    "time/step": round(time.monotonic() - t0, 3),
                }
                run.metrics(**record)
                log.info(
                    "RL step %d/%d reward %.3f model turns %.2f tool turns %.2f trainable tokens %d",
                    step, rl_steps, stats["reward/mean"], stats["model_turns/mean"],
                    stats["tool_turns/mean"], stats["trainable_tokens"],
                )  # fmt: skip
                if step % profile.ckpt.interval == 0 or step == rl_steps:
                    trainer.save_resumable(step, {"state": state})
                if config.stop_after_step and step >= config.stop_after_step and step < rl_steps:
                    log.info("stopping after step %d as asked (stop_after_step)", step)
                    loop.close()
                    client.cancel_job(job_id)
                    return {"stopped_after_step": step, "run_dir": str(run.path)}
            eval_after = greedy_eval(play, tasks, seed)
            log.info("eval after RL: %s", eval_after)
            loop.close()
        client.cancel_job(job_id)

    history = run.read_metrics()
    summary = {
        "profile": profile.name,
        "config_hash": profile.config_hash,
        "renderer_check": history_check,
        "warm_start": state["warm_start"],
        "eval_before_rl": state["eval_before_rl"],
        "eval_after_rl": eval_after,
        "steps": [h["step"] for h in history],
        "rewards": [h["reward/mean"] for h in history],
        "trainable_tokens": [h["trainable_tokens"] for h in history],
        "model_turns": [h["model_turns/mean"] for h in history],
        "tool_turns": [h["tool_turns/mean"] for h in history],
        "mask_sha256": [h["mask_sha256"] for h in history],
        "resumed_from_step": resume["step"] if resume else None,
        "wall_time_s": round(time.monotonic() - started, 1),
    }
    return run.summary(summary)


def renderer_config(profile: TitoProfile):
    from renderers.configs import Qwen3RendererConfig

    return {"qwen3": Qwen3RendererConfig}[profile.renderer]()


def pick_tasks(tasks: list, n: int, seed: int, step: int) -> list:
    """A seeded choice of ``n`` tasks for ``step`` (the same on a resumed run)."""
    order = list(range(len(tasks)))
    random.Random(seed * 1_000_003 + step).shuffle(order)
    return [tasks[i] for i in (order * (n // len(order) + 1))[:n]]


def greedy_eval(play, tasks: list, seed: int) -> dict:
    episodes = [
        play(task, f"eval-{seed}-{task.data.idx}", 0.0)
        for task in progress.bar(tasks, desc="tito eval", unit="episode")
    ]
    n = len(episodes)
    return {
        "reward": sum(e.reward for e in episodes) / n,
        "called_tool": sum(e.tool_turns > 0 for e in episodes) / n,
        "answered": sum(e.stop == "answered" for e in episodes) / n,
        "model_turns": sum(len(e.turns) for e in episodes) / n,
    }


def warm_start(trainer, profile, config, tokenizer, renderer, tools, facts, pad_id) -> dict:
    """SFT on the demonstrations (causal_cross_entropy), seeded batches, as the SFT journey."""
    steps = config.warm_start_steps if config.warm_start_steps >= 0 else profile.warm_start.steps
    examples = demonstrations(tokenizer, renderer, tools, facts)
    rng = random.Random(profile.seed)
    losses = []
    for step in progress.bar(range(1, steps + 1), desc="tito warm start"):
        batch = [
            examples[rng.randrange(len(examples))] for _ in range(profile.warm_start.batch_size)
        ]
        frame = frames.sft_frame(collate(batch, pad_id=pad_id, max_seq_len=profile.max_seq_len))
        result, _ = trainer.train_step(frame, learning_rate=profile.warm_start.learning_rate)
        losses.append(result["avg_loss"])
        if step % 25 == 0 or step == steps:
            log.info("warm start step %d/%d loss %.4f", step, steps, losses[-1])
    return {
        "steps": steps,
        "first_loss": losses[0] if losses else None,
        "final_loss": losses[-1] if losses else None,
    }


if __name__ == "__main__":
    out = main(profiles.entrypoint(Config, TitoProfile))
    keys = ("profile", "eval_before_rl", "eval_after_rl", "rewards", "wall_time_s")
    print(json.dumps({k: out.get(k) for k in keys} if "profile" in out else out))
    sys.exit(0)
