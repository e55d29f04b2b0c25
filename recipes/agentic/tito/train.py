"""Token-in/token-out agentic RL: multi-turn tool use with exact token ids and action masks.

    python -m recipes.agentic.tito.train                       # CPU profile (SmolLM2, two lookups in a chain)
    python -m recipes.agentic.tito.train profile=recipes/agentic/tito/configs/local-cpu-tiny-qwen3-smoke.json

1. Check that the renderer extends the environment's turns token for token (reject otherwise).
2. Warm start: SFT on tool-use demonstrations (the SFT journey's library), so the model really
   emits ``facts_lookup`` calls. Then save checkpoint ``step_0``.
3. RL: episodes run through verifiers' ``TrainClient`` -> this repo's ``/inference/v1/generate``
   gateway -> the sampling sub-job's token-id ``generate``. Each turn's prompt bridges onto
   the previous prompt + completion ids; tool results are appended as context. Episodes play
   together, their turns sampled in deterministic lockstep batches
   (:mod:`cortex_recipes.tito.batching`). The trace's ``sampled_mask`` is the action mask:
   ``grpo`` trains only on the tokens the model sampled, with the sampler's logprobs as
   ``old_log_probs_shifted``. Then step and weight sync, and the next step's episodes are
   played with the synced policy.
4. Checkpoints every ``ckpt.interval`` steps in the run folder ``runs/tito/<run_name>/``
   (cortex_recipes.run): the trainer's resumable save plus the task sampler's state and the
   next step's episodes, masks included (:mod:`cortex_recipes.tito.schedule`). Rerunning the
   command resumes: it trains on the saved episodes, then plays on from the saved sampler.
5. A greedy eval before and after RL: on ``eval_questions`` (held out) when the profile has
   them, else on the training tasks; per-item rewards go into the summary.
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

from cortex_recipes import completions, driver, frames, profiles, progress
from cortex_recipes.envs.glossary import (
    GlossaryTaskset,
    GlossaryToolset,
    chain_tasks,
    compare_tasks,
    glossary_config,
    load_chain_questions,
    load_facts,
    load_questions,
    tool_specs,
)
from cortex_recipes.models import load_tokenizer, resolve_model_path
from cortex_recipes.run import RunConfig, profile_field
from cortex_recipes.supervision import collate, make_renderer
from cortex_recipes.tito.batching import LockstepBatcher, sdk_generate_rows
from cortex_recipes.tito.episode import run_episode
from cortex_recipes.tito.gateway import Gateway, create_gateway_app
from cortex_recipes.tito.prefix import check_linear_history
from cortex_recipes.tito.profile import TitoProfile, load_tito_profile
from cortex_recipes.tito.schedule import TaskSampler, pending_from_json, pending_to_json
from cortex_recipes.tito.tool_model import with_renderer_tokens
from cortex_recipes.tito.training import (
    chain_demonstration,
    compare_demonstration,
    demonstration,
    demonstrations,
    episode_frame,
    groups_digest,
    wire_tools,
)
from cortex_recipes.training_job import Trainer

log = logging.getLogger("recipes.agentic.tito")
DEFAULT_PROFILE = "recipes/agentic/tito/configs/local-cpu-smollm2-chain.json"
GATEWAY_KEY_ENV = (
    "CORTEX_TITO_GATEWAY_KEY"  # the loopback gateway needs no key; the client wants a name
)


@chz.chz
class Config(RunConfig):
    profile: str = profile_field(DEFAULT_PROFILE)
    rl_steps: int = profiles.count_field("0: the profile's rl.steps")
    rollouts_rate: float = completions.rate_field()
    warm_start_steps: int = profiles.count_field(
        "< 0: the profile's warm_start.steps", low=-1, meaning="-1: the profile's warm_start.steps"
    )
    final_eval: bool = chz.field(default=True, doc="the greedy eval after RL (false: skip it)")
    stop_after_step: int = profiles.count_field(
        "> 0: stop after this RL step (an interruption, for resume checks)", meaning="0: no stop"
    )


def main(config: Config) -> dict:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per turn otherwise
    profile = load_tito_profile(config.profile, config.overrides)
    run = config.open_run("tito", profile)
    if run.finished:
        return run.finished
    resume = run.resume

    model_dir = (
        str(with_renderer_tokens(profile.model)) if profile.add_renderer_tokens else profile.model
    )
    tokenizer = load_tokenizer(model_dir)
    renderer = make_renderer(tokenizer, profile.renderer)
    facts = load_facts("tasks", profile.tasks, profile.recipe_dir)
    glossary = glossary_config(facts)
    toolset = GlossaryToolset(glossary.task.tools)
    tools = tool_specs(toolset)
    if profile.questions:
        chain = profile.question_type == "chain"
        load, make = (
            (load_chain_questions, chain_tasks) if chain else (load_questions, compare_tasks)
        )
        questions = load("questions", profile.questions, profile.recipe_dir, facts)
        tasks = make(glossary, questions)
        eval_tasks = (
            make(
                glossary,
                load("eval_questions", profile.eval_questions, profile.recipe_dir, facts),
            )
            if profile.eval_questions
            else tasks
        )
        sample_conversation = (
            chain_demonstration(questions[0], facts)
            if chain
            else compare_demonstration(questions[0], facts)
        )  # the longest conversation the warm start teaches
    else:
        questions = []
        tasks = eval_tasks = GlossaryTaskset(glossary).load()
        sample_conversation = demonstration(*next(iter(facts.items())))
    history_check = check_linear_history(
        renderer, sample_conversation, wire_tools(tools)
    )  # before any training: refuse templates that cannot extend turns exactly
    pad_id = frames.pad_id(tokenizer)
    rl_steps = config.rl_steps or profile.rl.steps
    seed = profile.seed
    written = completions.RolloutWriter(run.path, tokenizer, rate=config.rollouts_rate)
    started = time.monotonic()

    with run.connect(config.connection) as client:
        trainer = Trainer.start(
            client, profile.sub_jobs(model_dir), run, weight_format=profile.weight_format
        )
        job_id = trainer.job_id
        if resume is not None:
            trainer.load(resume)  # and sync
            state = resume["state"]
        else:
            state = {
                "warm_start": warm_start(
                    trainer, profile, config, tokenizer, renderer, tools, facts, questions, pad_id
                )
            }
            trainer.sync()
            trainer.save_resumable(0, {"state": state})

        batcher = LockstepBatcher(sdk_generate_rows(client, job_id))
        app = create_gateway_app(
            batcher.generate, model=profile.model, max_model_len=profile.max_seq_len, base_seed=seed
        )
        os.environ.setdefault(GATEWAY_KEY_ENV, "local")
        with batcher, Gateway(app) as gateway:
            train_client = resolve_client(
                TrainClientConfig(
                    base_url=gateway.base_url,
                    api_key_var=GATEWAY_KEY_ENV,
                    renderer=renderer_config(profile),
                    renderer_model_name=str(resolve_model_path(model_dir)),
                )
            )

            loop = episode_loop()

            def play(specs: list, temperature: float, max_tokens: int) -> list:
                """Episodes for ``(task, session id)`` specs, ``rl.play_together`` at a time."""
                sampling = vf.SamplingConfig(temperature=temperature, max_tokens=max_tokens)
                episodes = []
                for at in range(0, len(specs), profile.rl.play_together):
                    wave = specs[at : at + profile.rl.play_together]
                    with batcher.playing(len(wave)) as leave:

                        async def one(task, session: str, leave=leave):
                            try:
                                return await run_episode(
                                    train_client, model=profile.model, task=task,
                                    toolset=toolset, tools=tools, sampling=sampling,
                                    session_id=session, max_turns=profile.rl.max_turns,
                                )  # fmt: skip
                            finally:
                                leave()

                        async def wave_of(wave=wave, one=one):
                            return await asyncio.gather(*(one(t, s) for t, s in wave))

                        episodes.extend(loop.run_until_complete(wave_of()))
                return episodes

            def collect(step: int) -> tuple[list, float]:
                """Play step ``step``'s groups with the current policy; write its rollouts."""
                t0 = time.monotonic()
                chosen = sampler.draw(profile.rl.tasks_per_step)
                specs = [
                    (tasks[i], f"{seed}-{step}-{i}-{k}-{sampler.nonce()}")
                    for i in chosen
                    for k in range(profile.rl.group_size)
                ]
                played = play(specs, profile.rl.temperature, profile.rl.max_tokens)
                size = profile.rl.group_size
                groups = [played[g : g + size] for g in range(0, len(played), size)]
                for k, episodes in enumerate(groups):  # one task's episodes, this step's policy
                    written.write_episodes(
                        step=step,
                        group=k,
                        policy_version=driver.sampling_version(step),
                        episodes=episodes,
                    )
                return groups, round(time.monotonic() - t0, 3)

            def evaluate() -> dict:
                specs = [(task, f"eval-{seed}-{task.data.idx}") for task in eval_tasks]
                return summarize_eval(
                    play(specs, 0.0, profile.eval.max_tokens or profile.rl.max_tokens)
                )

            if "eval_before_rl" not in state:
                state["eval_before_rl"] = evaluate()
                log.info("eval after warm start: %s", brief(state["eval_before_rl"]))
            first = resume["step"] + 1 if resume else 1
            pending = None
            if resume is not None and "sampler" in state:
                sampler = TaskSampler.from_state(state["sampler"], len(tasks))
                if state.get("pending") is not None and first <= rl_steps:
                    pending = pending_from_json(state["pending"], first, groups_digest)
                    log.info(
                        "resuming step %d on the %d episodes its checkpoint saved", first,
                        sum(len(g) for g in pending[0]),
                    )  # fmt: skip
            else:
                sampler = TaskSampler(len(tasks), seed)
            restored = pending is not None
            run.track_steps(rl_steps)
            for step in range(first, rl_steps + 1):
                t0 = time.monotonic()
                groups, rollout_s = pending if pending is not None else collect(step)
                pending = None
                frame, stats = episode_frame(groups, pad_id, profile.rl.loss_config())
                result, _ = trainer.train_step(frame, learning_rate=profile.rl.learning_rate)
                trainer.sync()
                if step < rl_steps:  # the next step's episodes, on the policy just synced
                    pending = collect(step + 1)
                state["sampler"] = sampler.state_dict()
                state["pending"] = (
                    pending_to_json(step + 1, pending[0], groups_digest(pending[0]), pending[1])
                    if pending is not None
                    else None
                )
                record = {
                    "step": step,
                    "loss": result["avg_loss"],
                    **stats,
                    "mismatch_kl/mean": result["metrics"].get("approx_kl"),
                    "time/rollouts": rollout_s,
                    "time/step": round(time.monotonic() - t0, 3),
                }
                run.metrics(**record)
                log.info(
                    "RL step %d/%d reward %.3f model turns %.2f tool calls %.2f trainable tokens %d",
                    step, rl_steps, stats["reward/mean"], stats["model_turns/mean"],
                    stats["tool_calls/mean"], stats["trainable_tokens"],
                )  # fmt: skip
                if step % profile.ckpt.interval == 0 or step == rl_steps:
                    trainer.save_resumable(step, {"state": state})
                if config.stop_after_step and step >= config.stop_after_step and step < rl_steps:
                    log.info("stopping after step %d as asked (stop_after_step)", step)
                    client.cancel_job(job_id)
                    return {"stopped_after_step": step, "run_dir": str(run.path)}
            eval_after = evaluate() if config.final_eval else None
            if eval_after is not None:
                log.info("eval after RL: %s", brief(eval_after))
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
        "tool_calls": [h.get("tool_calls/mean") for h in history],
        "multi_call": [h.get("multi_call/share") for h in history],
        "losses": [h["loss"] for h in history],
        "mask_sha256": [h["mask_sha256"] for h in history],
        "resumed_from_step": resume["step"] if resume else None,
        "resumed_on_saved_episodes": restored,
        "eval_tasks": len(eval_tasks),
        "wall_time_s": round(time.monotonic() - started, 1),
    }
    return run.summary(summary)


_LOOP: asyncio.AbstractEventLoop | None = None


def episode_loop() -> asyncio.AbstractEventLoop:
    """The event loop episodes play on: one per process, kept open. ``renderers`` holds a
    module-level ``asyncio.Lock`` (its max-prompt-length lookup) that binds to the first loop
    it is contended on, so a second run in the same process (a qualification's resume, a test)
    on a fresh loop would fail on it once its episodes play concurrently."""
    global _LOOP
    if _LOOP is None or _LOOP.is_closed():
        _LOOP = asyncio.new_event_loop()
    return _LOOP


def renderer_config(profile: TitoProfile):
    from renderers.configs import Qwen3RendererConfig

    return {"qwen3": Qwen3RendererConfig}[profile.renderer]()


def summarize_eval(episodes: list) -> dict:
    n = len(episodes)
    return {
        "reward": sum(e.reward for e in episodes) / n,
        "called_tool": sum(e.tool_turns > 0 for e in episodes) / n,
        "two_calls": sum(e.tool_calls >= 2 for e in episodes) / n,
        "answered": sum(e.stop == "answered" for e in episodes) / n,
        "model_turns": sum(len(e.turns) for e in episodes) / n,
        "rewards": [e.reward for e in episodes],
    }


def brief(result: dict) -> dict:
    return {k: v for k, v in result.items() if k != "rewards"}


def warm_start(
    trainer, profile, config, tokenizer, renderer, tools, facts, questions, pad_id
) -> dict:
    """SFT on the demonstrations (causal_cross_entropy), seeded batches, as the SFT journey."""
    steps = config.warm_start_steps if config.warm_start_steps >= 0 else profile.warm_start.steps
    examples = demonstrations(
        tokenizer, renderer, tools, facts, questions,
        question_type=profile.question_type,
        complete_share=profile.warm_start.complete_share, seed=profile.seed,
    )  # fmt: skip
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


def summary_line(out: dict) -> str:
    keys = ("profile", "eval_before_rl", "eval_after_rl", "rewards", "wall_time_s")
    return json.dumps({k: out.get(k) for k in keys} if "profile" in out else out)


if __name__ == "__main__":
    sys.exit(profiles.command_line(Config, TitoProfile, main, summary_line))
