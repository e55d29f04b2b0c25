"""Asynchronous GRPO on prime-rl's own orchestrator, with Cortex as its trainer and inference.

    python -m recipes.rl.async_grpo.train                      # CPU profile, 10 steps
    python -m recipes.rl.async_grpo.train steps=2 profile=recipes/rl/async_grpo/configs/local-cpu-tiny-qwen3-smoke.json

prime-rl's orchestrator and one env-server (commit 559b447, in the Python 3.12 environment that
``$CORTEX_RECIPES_PRIMERL_PYTHON`` names; recipes/rl/async_grpo/primerl/install.sh builds it)
drive the run. They talk to this project's two adapters (``cortex_recipes.primerl``): an
inference server backed by the Cortex sampling sub-job, and a trainer that reads prime-rl's
rollout files, runs ``grpo`` forward-backward and the optimiser step on the Cortex training
sub-job, saves each version's weights and publishes it. prime-rl bounds the policy lag
(``orchestrator.max_off_policy_steps``) and reports it per step; the run's ``metrics.jsonl``
holds both sides' numbers. Greedy evaluation on a fixed problem set runs before and after
training. After a kill, the same command resumes both sides from the run's newest resume
point; a lost backend is reconnected and resumed within the same command.
"""

from __future__ import annotations

import json
import logging
import sys
import time

import chz

from cortex_recipes import driver, profiles
from cortex_recipes.models import load_tokenizer
from cortex_recipes.primerl.launch import installed_commits, primerl_python
from cortex_recipes.profiles import ProfileError
from cortex_recipes.reconnect import is_recoverable
from cortex_recipes.rl.grpo import greedy_eval
from cortex_recipes.rl.grpo_profile import GRPOProfile, load_grpo_profile
from cortex_recipes.run import Run, RunConfig, command_line, profile_field
from cortex_recipes.training_job import Trainer

log = logging.getLogger("recipes.rl.async_grpo")
DEFAULT_PROFILE = "recipes/rl/async_grpo/configs/local-cpu-smollm2-lora.json"


@chz.chz
class Config(RunConfig):
    profile: str = profile_field(DEFAULT_PROFILE)
    max_reconnects: int = profiles.count_field(
        "reconnects after a lost backend before the run gives up", default=3
    )


def main(config: Config) -> dict:
    driver.start_logging()
    profile = load_grpo_profile(config.profile, config.overrides)
    if not profile.is_async:
        raise ProfileError(
            f"{config.profile}: orchestrator.max_off_policy_steps is not set; "
            "synchronous profiles belong to recipes/rl/math_grpo"
        )
    primerl_python()  # fail closed before anything is started or written
    run = config.open_run("async_grpo", profile)
    if run.finished:
        return run.finished
    run.prelaunch(config.connection)  # the local backend starts while the data loads
    reconnects = 0
    while True:
        run.reload_resume()
        try:
            return train(config, profile, run, reconnects)
        except Exception as exc:
            if not is_recoverable(exc) or reconnects >= config.max_reconnects:
                raise
            reconnects += 1
            log.warning(
                "lost the backend (%s: %s); reconnect %d/%d, resuming after step %d",
                type(exc).__name__, exc, reconnects, config.max_reconnects,
                (run.checkpoints.steps() or [0])[-1],
            )  # fmt: skip
            time.sleep(min(2.0**reconnects, 30.0))


class Evals:
    """The run's greedy evals on the fixed eval set (Math GRPO evaluates on the same): before
    training (:meth:`begin`, while prime-rl's processes start; on a resume, the first
    command's, carried in every resume point) and of the last version, which prime-rl's loop
    asks for before it records the last step."""

    def __init__(self, client, trainer: Trainer, profile: GRPOProfile, run, max_steps: int):
        self.client, self.trainer, self.profile, self.max_steps = (
            client,
            trainer,
            profile,
            max_steps,
        )
        self.tokenizer = load_tokenizer(profile.model)
        _, self.eval_env = profile.envs()
        self.history: list[dict] = list(run.resume["evals"]) if run.resume else []
        self.last: dict | None = None

    def begin(self) -> None:
        """The evaluation before training (a new run's; a resumed one carries it)."""
        if not self.history:
            self.history.append(self.at(0))

    def at(self, step: int) -> dict:
        found = greedy_eval(
            self.client, self.trainer.job_id, self.tokenizer, self.eval_env,
            self.profile.eval_max_tokens,
        )  # fmt: skip
        log.info("eval at step %d: accuracy %.3f", step, found["accuracy"])
        return {"step": step, "accuracy": found["accuracy"], "correct": found["correct"]}

    def of_last_version(self) -> float:
        self.trainer.sync()  # the sampler may hold the previous version: evaluate the last one
        self.last = self.at(self.max_steps)
        return self.last["accuracy"]


def train(config: Config, profile: GRPOProfile, run: Run, reconnects: int = 0) -> dict:
    """prime-rl's orchestrator + env-server drive the job through the two adapters. After a
    kill, rerunning resumes both from the run's newest resume point (the eval history rides in
    it), every step logged once."""
    from recipes.rl.async_grpo.loop import run_primerl

    max_steps = config.steps_for(profile)
    with run.connect(config.connection, client_options={"poll_timeout": 1800.0}) as client:
        trainer = Trainer.start(
            client, profile.sub_jobs(), run, weight_format=profile.weight_format
        )
        evals = Evals(client, trainer, profile, run, max_steps)
        out = run_primerl(
            client, profile, run, max_steps=max_steps, job_id=trainer.job_id,
            state={"evals": evals.history}, begin=evals.begin,
            evaluate_last=evals.of_last_version,
        )  # fmt: skip
        if evals.last is None:  # the last step was recorded before a kill: evaluate it now
            evals.of_last_version()
        client.cancel_job(trainer.job_id)
    return run.summary(
        {
            "profile": profile.name,
            "config_hash": profile.config_hash,
            **out,
            "max_off_policy_steps": profile.orchestrator.max_off_policy_steps,
            "reconnects": reconnects,
            # which prime-rl and verifiers ran (install.sh's record, else pip's)
            "primerl": installed_commits(primerl_python()),
            "eval_accuracy": [*evals.history, evals.last],
        }
    )


def summary_line(out: dict) -> str:
    """The result as one JSON line, then the run's next steps."""
    if "profile" not in out:  # stopped before its end (stop_after): it says how to go on
        return json.dumps(out)
    keys = ("profile", "orchestrator", "eval_accuracy", "losses", "published_versions")
    line = json.dumps({k: out[k] for k in keys})
    return "\n".join([line, *driver.next_steps(out["run_dir"])])


if __name__ == "__main__":
    sys.exit(command_line(Config, GRPOProfile, main, summary_line))
