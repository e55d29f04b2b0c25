"""What a TITO run saves so that a resume continues it exactly: the task sampler and the batch
of episodes already played for the next step.

- :class:`TaskSampler` chooses each RL step's tasks (a seeded shuffle of the task list, epoch
  after epoch) and draws a nonce for every episode's session id (from which the gateway
  derives the sampling seed). It is one stream, not a function of the step number, so a resume
  must restore it: its ``state_dict`` (epoch, cursor, order and the generator's state) goes into
  every checkpoint.
- The next step's episodes are played right after a step's weight sync, with the policy the
  checkpoint holds, and saved with it (:func:`pending_to_json`): token ids, action masks,
  sampler logprobs, rewards and turns, with the digest of the batch's rows and masks. A resume
  trains on exactly those episodes (:func:`pending_from_json` checks them and the digest), then
  plays on from the restored sampler.

Anything malformed in a saved state is refused with :class:`ScheduleError`, naming the field.
"""

from __future__ import annotations

import math
import random
from typing import Any

from cortex_recipes.tito.episode import Episode, TurnRecord

STATE_VERSION = 1


class ScheduleError(ValueError):
    """A saved sampler state or batch of episodes that cannot be restored."""


class TaskSampler:
    """Seeded task order and episode nonces, one stream for the whole run."""

    def __init__(self, n_tasks: int, seed: int):
        if n_tasks <= 0:
            raise ScheduleError(f"n_tasks={n_tasks!r}: a sampler needs at least one task")
        self.n_tasks = n_tasks
        self.rng = random.Random(seed)
        self.epoch = 0
        self.cursor = 0
        self.order = self._shuffled()

    def _shuffled(self) -> list[int]:
        order = list(range(self.n_tasks))
        self.rng.shuffle(order)
        return order

    def draw(self, k: int) -> list[int]:
        """The next ``k`` task indices (a new shuffle each time the list is used up)."""
        chosen = []
        for _ in range(k):
            if self.cursor == self.n_tasks:
                self.epoch, self.cursor = self.epoch + 1, 0
                self.order = self._shuffled()
            chosen.append(self.order[self.cursor])
            self.cursor += 1
        return chosen

    def nonce(self) -> str:
        return f"{self.rng.getrandbits(32):08x}"

    def state_dict(self) -> dict[str, Any]:
        version, internal, gauss = self.rng.getstate()
        return {
            "version": STATE_VERSION,
            "n_tasks": self.n_tasks,
            "epoch": self.epoch,
            "cursor": self.cursor,
            "order": list(self.order),
            "rng": [version, list(internal), gauss],
        }

    @classmethod
    def from_state(cls, state: Any, n_tasks: int, where: str = "sampler") -> TaskSampler:
        if not isinstance(state, dict):
            raise ScheduleError(f"{where}={type(state).__name__}: a saved sampler is an object")
        if state.get("version") != STATE_VERSION:
            raise ScheduleError(
                f"{where}.version={state.get('version')!r}; this code reads {STATE_VERSION}"
            )
        if state.get("n_tasks") != n_tasks:
            raise ScheduleError(
                f"{where}.n_tasks={state.get('n_tasks')!r} but the profile has {n_tasks} tasks; "
                "the run was started on other tasks (start a new run)"
            )
        order = state.get("order")
        if not isinstance(order, list) or sorted(order) != list(range(n_tasks)):
            raise ScheduleError(f"{where}.order is not a permutation of the {n_tasks} tasks")
        cursor, epoch = state.get("cursor"), state.get("epoch")
        if not _is_int(cursor) or not 0 <= cursor <= n_tasks:
            raise ScheduleError(f"{where}.cursor={cursor!r} must be an integer in [0, {n_tasks}]")
        if not _is_int(epoch) or epoch < 0:
            raise ScheduleError(f"{where}.epoch={epoch!r} must be an integer >= 0")
        rng = state.get("rng")
        try:
            version, internal, gauss = rng
            if not _is_int(version) or not all(_is_int(x) for x in internal):
                raise TypeError("not integers")
            restored = random.Random()
            restored.setstate((version, tuple(internal), gauss))
        except (TypeError, ValueError) as exc:
            raise ScheduleError(f"{where}.rng cannot be restored: {exc}") from exc
        sampler = cls.__new__(cls)
        sampler.n_tasks, sampler.rng = n_tasks, restored
        sampler.epoch, sampler.cursor, sampler.order = epoch, cursor, list(order)
        return sampler


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _int_list(value: Any, where: str) -> list[int]:
    if not isinstance(value, list) or not all(_is_int(x) for x in value):
        raise ScheduleError(f"{where} must be a list of integers")
    return value


def _float_list(value: Any, where: str) -> list[float]:
    if not isinstance(value, list) or not all(
        isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x) for x in value
    ):
        raise ScheduleError(f"{where} must be a list of finite numbers")
    return [float(x) for x in value]


def episode_to_json(episode: Episode) -> dict[str, Any]:
    return {
        "task_index": episode.task_index,
        "reward": episode.reward,
        "stop": episode.stop,
        "token_ids": list(episode.token_ids),
        "sampled_mask": [int(m) for m in episode.sampled_mask],
        "logprobs": list(episode.logprobs),
        "turns": [
            {
                "prompt_ids": t.prompt_ids,
                "completion_ids": t.completion_ids,
                "logprobs": t.logprobs,
                "bridged": t.bridged,
                "finish_reason": t.finish_reason,
                "tool_calls": t.tool_calls,
            }
            for t in episode.turns
        ],
    }


def episode_from_json(data: Any, where: str) -> Episode:
    if not isinstance(data, dict):
        raise ScheduleError(f"{where} must be an object")
    tokens = _int_list(data.get("token_ids"), f"{where}.token_ids")
    mask = data.get("sampled_mask")
    if not isinstance(mask, list) or not all(
        m in (0, 1) and not isinstance(m, float) for m in mask
    ):
        raise ScheduleError(f"{where}.sampled_mask must be a list of 0/1")
    logprobs = _float_list(data.get("logprobs"), f"{where}.logprobs")
    if not (len(tokens) == len(mask) == len(logprobs)):
        raise ScheduleError(
            f"{where}: token_ids ({len(tokens)}), sampled_mask ({len(mask)}) and logprobs "
            f"({len(logprobs)}) must have the same length"
        )
    reward = data.get("reward")
    if not isinstance(reward, int | float) or isinstance(reward, bool) or not math.isfinite(reward):
        raise ScheduleError(f"{where}.reward={reward!r} must be a finite number")
    if data.get("stop") not in ("answered", "max_turns", "overlong"):
        raise ScheduleError(
            f"{where}.stop={data.get('stop')!r}; accepted: answered, max_turns, overlong"
        )
    turns = data.get("turns")
    if not isinstance(turns, list):
        raise ScheduleError(f"{where}.turns must be a list")
    records = []
    for k, turn in enumerate(turns):
        at = f"{where}.turns[{k}]"
        if not isinstance(turn, dict) or not isinstance(turn.get("tool_calls"), list):
            raise ScheduleError(f"{at} must be an object with a tool_calls list")
        records.append(
            TurnRecord(
                prompt_ids=_int_list(turn.get("prompt_ids"), f"{at}.prompt_ids"),
                completion_ids=_int_list(turn.get("completion_ids"), f"{at}.completion_ids"),
                logprobs=_float_list(turn.get("logprobs"), f"{at}.logprobs"),
                bridged=bool(turn.get("bridged")),
                finish_reason=turn.get("finish_reason"),
                tool_calls=list(turn["tool_calls"]),
            )
        )
    if not _is_int(data.get("task_index")):
        raise ScheduleError(f"{where}.task_index={data.get('task_index')!r} must be an integer")
    return Episode(
        task_index=data["task_index"],
        reward=float(reward),
        stop=data["stop"],
        turns=records,
        token_ids=tokens,
        sampled_mask=[bool(m) for m in mask],
        logprobs=logprobs,
    )


def pending_to_json(step: int, groups: list[list[Episode]], sha256: str, seconds: float) -> dict:
    """The next step's batch, as a checkpoint saves it."""
    return {
        "step": step,
        "episodes_sha256": sha256,
        "time/rollouts": seconds,
        "groups": [[episode_to_json(e) for e in group] for group in groups],
    }


def pending_from_json(
    data: Any, step: int, digest, where: str = "pending"
) -> tuple[list[list[Episode]], float]:
    """The saved batch for ``step`` and the seconds it took to play; ``digest(groups)`` must
    reproduce the saved ``episodes_sha256`` (token ids, action masks, logprobs and rewards)."""
    if not isinstance(data, dict):
        raise ScheduleError(f"{where} must be an object")
    if data.get("step") != step:
        raise ScheduleError(f"{where}.step={data.get('step')!r}; the resume's next step is {step}")
    raw_groups = data.get("groups")
    if not isinstance(raw_groups, list) or not raw_groups:
        raise ScheduleError(f"{where}.groups must be a non-empty list of episode groups")
    groups = []
    for g, group in enumerate(raw_groups):
        if not isinstance(group, list) or not group:
            raise ScheduleError(f"{where}.groups[{g}] must be a non-empty list of episodes")
        groups.append(
            [episode_from_json(e, f"{where}.groups[{g}][{k}]") for k, e in enumerate(group)]
        )
    found = digest(groups)
    if found != data.get("episodes_sha256"):
        raise ScheduleError(
            f"{where}.episodes_sha256={data.get('episodes_sha256')!r} but the saved episodes hash to "
            f"{found!r}: the saved rows or action masks were changed"
        )
    seconds = data.get("time/rollouts", 0.0)
    return groups, float(seconds) if isinstance(seconds, int | float) else 0.0
