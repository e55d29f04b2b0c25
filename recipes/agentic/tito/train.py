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
from cortex_recipes.gateway import Gateway, create_gateway_app
from cortex_recipes.models import load_tokenizer, resolve_model_path
from cortex_recipes.run import RunConfig, command_line, profile_field
from cortex_recipes.supervision import collate, make_renderer
from cortex_recipes.tito.batching import LockstepBatcher, sdk_generate_rows
from cortex_recipes.tito.episode import run_episode
from cortex_recipes.tito.prefix import check_linear_history
from cortex_recipes.tito.schedule import TaskSampler, pending_from_json, pending_to_json
from cortex_recipes.tito.tito_profile import TitoProfile, load_tito_profile
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
    rollouts_rate: float = completions.rate_field()
    warm_start_steps: int = profiles.count_field(
        "< 0: the profile's warm_start.steps", low=-1, meaning="-1: the profile's warm_start.steps"
    )
    final_eval: bool = chz.field(default=True, doc="the greedy eval after RL (false: skip it)")
    stop_after_step: int = profiles.count_field(
        "> 0: stop after this RL step (an interruption, for resume checks)", meaning="0: no stop"
    )


class Tito:
    """TITO agentic RL for :func:`cortex_recipes.driver.drive` (module docstring): a warm start
    and its resume point ``step_0`` before the first RL step; each RL step trains on episodes
    played with the current policy, then plays the next step's on the policy it synced."""

    log_keys = (("reward/mean", ".3f"), ("model_turns/mean", ".2f"), ("tool_calls/mean", ".2f"),
                ("trainable_tokens", ""))  # fmt: skip

    def __init__(self, config: Config, profile: TitoProfile, run, steps: int):
        self.config, self.profile, self.run, self.steps = config, profile, run, steps
        self.model_dir = (
            str(with_renderer_tokens(profile.model))
            if profile.add_renderer_tokens
            else profile.model
        )
        self.tokenizer = load_tokenizer(self.model_dir)
        self.renderer = make_renderer(self.tokenizer, profile.renderer)
        self.facts = load_facts("tasks", profile.tasks, profile.recipe_dir)
        glossary = glossary_config(self.facts)
        self.toolset = GlossaryToolset(glossary.task.tools)
        self.tools = tool_specs(self.toolset)
        self.questions, self.tasks, self.eval_tasks, sample = self.task_sets(glossary)
        # before any training: refuse templates that cannot extend turns exactly
        self.history_check = check_linear_history(self.renderer, sample, wire_tools(self.tools))
        self.pad_id = frames.pad_id(self.tokenizer)
        self.written = completions.RolloutWriter(
            run.path, self.tokenizer, rate=config.rollouts_rate
        )
        self.saved: dict | None = None  # what every resume point carries
        self.pending = None  # the next step's (groups, rollout seconds), played ahead
        self.restored = False

    def task_sets(self, glossary) -> tuple[list, list, list, list]:
        """Questions, training tasks, eval tasks and the longest conversation the warm start
        teaches (the renderer check's sample)."""
        profile, facts = self.profile, self.facts
        if not profile.questions:
            tasks = GlossaryTaskset(glossary).load()
            return [], tasks, tasks, demonstration(*next(iter(facts.items())))
        chain = profile.question_type == "chain"
        load, make = (
            (load_chain_questions, chain_tasks) if chain else (load_questions, compare_tasks)
        )
        questions = load("questions", profile.questions, profile.recipe_dir, facts)
        tasks = make(glossary, questions)
        eval_tasks = tasks
        if profile.eval_questions:
            held_out = load("eval_questions", profile.eval_questions, profile.recipe_dir, facts)
            eval_tasks = make(glossary, held_out)
        show = chain_demonstration if chain else compare_demonstration
        return questions, tasks, eval_tasks, show(questions[0], facts)

    def start(self, client, run, stack) -> Trainer:
        self.client, self.stack = client, stack
        self.trainer = Trainer.start(
            client, self.profile.sub_jobs(self.model_dir), run,
            weight_format=self.profile.weight_format,
        )  # fmt: skip
        return self.trainer  # a resume loads and syncs it

    def restore(self, state: dict) -> None:
        self.saved = state["state"]

    def begin(self) -> None:
        profile = self.profile
        if self.saved is None:  # a new run: the warm start, then its resume point step_0
            self.saved = {
                "warm_start": warm_start(
                    self.trainer, profile, self.config, self.tokenizer, self.renderer,
                    self.tools, self.facts, self.questions, self.pad_id,
                )
            }  # fmt: skip
            self.trainer.sync()
            self.trainer.save_resumable(0, self.state())
        self.batcher = self.stack.enter_context(
            LockstepBatcher(sdk_generate_rows(self.client, self.trainer.job_id))
        )
        app = create_gateway_app(
            self.batcher.generate, model=profile.model, max_model_len=profile.max_seq_len,
            base_seed=profile.seed,
        )  # fmt: skip
        os.environ.setdefault(GATEWAY_KEY_ENV, "local")
        gateway = self.stack.enter_context(Gateway(app))
        self.train_client = resolve_client(
            TrainClientConfig(
                base_url=gateway.base_url,
                api_key_var=GATEWAY_KEY_ENV,
                renderer=renderer_config(profile),
                renderer_model_name=str(resolve_model_path(self.model_dir)),
            )
        )
        saved = self.saved
        if "eval_before_rl" not in saved:
            saved["eval_before_rl"] = self.greedy_eval()
            log.info("eval after warm start: %s", brief(saved["eval_before_rl"]))
        first = (self.run.resumed_from_step or 0) + 1
        if "sampler" in saved:  # resumed after an RL step
            self.sampler = TaskSampler.from_state(saved["sampler"], len(self.tasks))
            if saved.get("pending") is not None and first <= self.steps:
                self.pending = pending_from_json(saved["pending"], first, groups_digest)
                self.restored = True
                log.info(
                    "resuming step %d on the %d episodes its checkpoint saved", first,
                    sum(len(g) for g in self.pending[0]),
                )  # fmt: skip
        else:
            self.sampler = TaskSampler(len(self.tasks), profile.seed)

    def step(self, step: int) -> dict:
        rl = self.profile.rl
        groups, rollout_s = self.pending if self.pending is not None else self.collect(step)
        self.pending = None
        frame, stats = episode_frame(groups, self.pad_id, rl.loss_config())
        result, _ = self.trainer.train_step(frame, learning_rate=self.profile.learning_rate)
        self.trainer.sync()
        if step < self.steps:  # the next step's episodes, on the policy just synced
            self.pending = self.collect(step + 1)
        self.saved["sampler"] = self.sampler.state_dict()
        self.saved["pending"] = (
            pending_to_json(
                step + 1, self.pending[0], groups_digest(self.pending[0]), self.pending[1]
            )  # fmt: skip
            if self.pending is not None
            else None
        )
        return {
            "loss": result["avg_loss"],
            **stats,
            "mismatch_kl/mean": result["metrics"].get("approx_kl"),
            "time/rollouts": rollout_s,
        }

    def evaluate(self, step: int) -> dict:
        return {}  # the greedy evals run after the warm start and after RL

    def state(self) -> dict:
        return {"state": self.saved}

    def finish(self, client) -> dict:
        eval_after = self.greedy_eval() if self.config.final_eval else None
        if eval_after is not None:
            log.info("eval after RL: %s", brief(eval_after))
        client.cancel_job(self.trainer.job_id)
        history = self.run.read_metrics()
        return {
            "renderer_check": self.history_check,
            "warm_start": self.saved["warm_start"],
            "eval_before_rl": self.saved["eval_before_rl"],
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
            "resumed_on_saved_episodes": self.restored,
            "eval_tasks": len(self.eval_tasks),
        }

    def collect(self, step: int) -> tuple[list, float]:
        """Play step ``step``'s groups with the current policy; write its rollouts."""
        rl, t0 = self.profile.rl, time.monotonic()
        chosen = self.sampler.draw(rl.tasks_per_step)
        specs = [
            (self.tasks[i], f"{self.profile.seed}-{step}-{i}-{k}-{self.sampler.nonce()}")
            for i in chosen
            for k in range(rl.group_size)
        ]
        played = self.play(specs, rl.temperature, rl.max_tokens)
        groups = [played[g : g + rl.group_size] for g in range(0, len(played), rl.group_size)]
        for k, episodes in enumerate(groups):  # one task's episodes, this step's policy
            self.written.write_episodes(
                step=step, group=k, policy_version=driver.sampling_version(step),
                episodes=episodes,
            )  # fmt: skip
        return groups, round(time.monotonic() - t0, 3)

    def greedy_eval(self) -> dict:
        specs = [(task, f"eval-{self.profile.seed}-{task.data.idx}") for task in self.eval_tasks]
        max_tokens = self.profile.eval.max_tokens or self.profile.rl.max_tokens
        with progress.task(f"eval: {len(specs)} greedy episodes", unit="eval"):
            return summarize_eval(self.play(specs, 0.0, max_tokens))

    def play(self, specs: list, temperature: float, max_tokens: int) -> list:
        """Episodes for ``(task, session id)`` specs, ``rl.play_together`` at a time."""
        sampling = vf.SamplingConfig(temperature=temperature, max_tokens=max_tokens)
        together, episodes = self.profile.rl.play_together, []
        for at in range(0, len(specs), together):
            wave = specs[at : at + together]
            with self.batcher.playing(len(wave)) as leave:
                episodes.extend(episode_loop().run_until_complete(self.wave(wave, sampling, leave)))
        return episodes

    async def wave(self, wave: list, sampling, leave) -> list:
        return await asyncio.gather(*(self.episode(t, s, sampling, leave) for t, s in wave))

    async def episode(self, task, session: str, sampling, leave):
        try:
            return await run_episode(
                self.train_client, model=self.profile.model, task=task, toolset=self.toolset,
                tools=self.tools, sampling=sampling, session_id=session,
                max_turns=self.profile.rl.max_turns,
            )  # fmt: skip
        finally:
            leave()


def main(config: Config) -> dict:
    driver.start_logging()
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per turn otherwise
    profile = load_tito_profile(config.profile, config.overrides)
    run = config.open_run("tito", profile)
    if run.finished:
        return run.finished
    run.prelaunch(config.connection)  # the local backend starts while the data loads
    steps = config.steps_for(profile)
    schedule = driver.Schedule(
        steps, ckpt_every=profile.ckpt.interval, ckpt_last=True,
        stop_after=config.stop_after_step,
    )  # fmt: skip
    algorithm = Tito(config, profile, run, steps)
    return driver.drive(run, config.connection, algorithm, schedule, profile_name=profile.name)


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
    """The result as one JSON line, then the run's next steps."""
    keys = ("profile", "eval_before_rl", "eval_after_rl", "rewards", "wall_time_s")
    if "profile" not in out:  # stopped before its end (stop_after): it says how to go on
        return json.dumps(out)
    line = json.dumps({k: out.get(k) for k in keys})
    return "\n".join([line, *driver.next_steps(out["run_dir"])])


if __name__ == "__main__":
    sys.exit(command_line(Config, TitoProfile, main, summary_line))
