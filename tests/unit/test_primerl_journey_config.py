"""The prime-rl configs the async GRPO journey writes, from its checked-in profiles."""

from __future__ import annotations

import dataclasses
import json
import tomllib
from pathlib import Path

import pytest

from tests import extras

pytest.importorskip("msgspec", reason=extras.reason("grpo"))

from cortex_recipes.primerl import configs, records
from cortex_recipes.rl.grpo import task_order
from cortex_recipes.rl.grpo_profile import load_grpo_profile
from recipes.rl.async_grpo import loop as journey

pytestmark = pytest.mark.unit
SMOKE = "recipes/rl/async_grpo/configs/local-cpu-tiny-qwen3-smoke.json"


def test_orchestrator_toml_carries_the_profile():
    profile = load_grpo_profile(SMOKE)
    text = configs.orchestrator_toml(
        profile, model_dir=Path("/m/tiny"), base_url="http://127.0.0.1:9/v1",
        output_dir=Path("/o"), port=5123, max_steps=3, tasks_path=Path("/o/tasks.jsonl"),
    )  # fmt: skip
    orch = tomllib.loads(text)
    assert orch["max_steps"] == 3 and orch["output_dir"] == "/o"
    assert orch["batch_size"] == profile.orchestrator.batch_size
    assert orch["group_size"] == profile.orchestrator.group_size
    assert orch["max_off_policy_steps"] == profile.orchestrator.max_off_policy_steps
    assert orch["seq_len"] == profile.max_seq_len
    assert orch["model"] == {
        "name": "/m/tiny",
        "client": {"base_url": "http://127.0.0.1:9/v1", "api_key_var": configs.API_KEY_VAR},
    }
    assert orch["renderer"] == {"name": "qwen3"}
    episodes = profile.orchestrator.max_inflight_groups * profile.orchestrator.group_size
    assert orch["concurrency"] == {
        "initial_inflight": episodes, "min_inflight": episodes, "max_inflight": episodes
    }  # fmt: skip
    assert orch["train"]["filter_zero_advantages"] is False
    assert orch["train"]["sampling"]["max_completion_tokens"] == 8
    (source,) = orch["train"]["source"]
    assert source["env"]["taskset"] == {"id": "cortex-arith", "tasks_path": "/o/tasks.jsonl"}
    assert source["env"]["agent"]["runtime"] == {"type": "subprocess"}
    assert source["serve"]["address"] == "tcp://127.0.0.1:5123"
    env = tomllib.loads(
        configs.env_server_toml(
            profile, output_dir=Path("/e"), port=5123, tasks_path=Path("/o/tasks.jsonl")
        )
    )
    assert env["env"]["taskset"] == source["env"]["taskset"]
    assert env["serve"] == source["serve"]


def test_a_smollm2_profile_renders_with_its_own_chat_template():
    assert configs.renderer_name("smollm2-135m-instruct") == "default"
    assert configs.renderer_name("Qwen/Qwen3-0.6B") == "qwen3"


def test_a_dataset_the_prime_rl_path_cannot_score_is_refused(tmp_path):
    profile = load_grpo_profile(SMOKE)
    other = dataclasses.replace(profile, env=dataclasses.replace(profile.env, dataset="chain_sum"))
    with pytest.raises(ValueError, match=r"env.dataset='chain_sum'"):
        configs.taskset_settings(other, tmp_path / "tasks.jsonl")
    with pytest.raises(ValueError, match=r"env.dataset='chain_sum'"):
        configs.write_tasks(other, tmp_path / "tasks.jsonl")


def test_the_taskset_file_holds_the_problems_and_prompts_the_eval_measures(tmp_path):
    """prime-rl trains on the same reasoning-gym problems, worded the same, as Math GRPO
    and the greedy eval (a taskset of its own wording and scoring taught a format the
    eval then scored 0)."""
    profile = load_grpo_profile("recipes/rl/async_grpo/configs/local-cpu-smollm2-lora.json")
    path = configs.write_tasks(profile, tmp_path / "primerl" / "tasks.jsonl")
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    env, _ = profile.envs()
    assert len(rows) == env.size
    order = task_order(profile.env.seed, env.size)
    assert sorted(order) == list(range(env.size)) and order != sorted(order)
    # line g is the problem Math GRPO's group g trains on (prime-rl reads in file order)
    for line in (0, 1, env.size - 1):
        task = env.task(order[line])
        assert rows[line] == {
            "prompt": env.prompt(task), "answer": task.answer,
            "partial_credit": profile.env.reward == "dataset",
        }  # fmt: skip
        assert env.score(task, rows[line]["answer"]) == 1.0
    assert rows[0]["prompt"].endswith(profile.env.instruction)
    assert not list(path.parent.glob("*.tmp"))


def test_merged_metrics_join_prime_rl_records_by_step(tmp_path):
    (tmp_path / "cortex").mkdir()
    (tmp_path / "cortex" / "trainer_metrics.jsonl").write_text(
        '{"step": 1, "loss": 0.5}\n{"step": 2, "loss": 0.25}\n'
    )
    (tmp_path / "metrics.jsonl").write_text('{"step": 2, "off_policy/max": 1}\n')
    assert records.merged_metrics(tmp_path) == [
        {"step": 1, "loss": 0.5},
        {"step": 2, "loss": 0.25, "primerl/off_policy/max": 1},
    ]


def test_orchestrator_toml_checkpoints_at_the_profile_interval_and_resumes_a_step():
    profile = load_grpo_profile("recipes/rl/async_grpo/configs/local-cpu-smollm2-lora.json")
    args = dict(model_dir=Path("/m"), base_url="http://127.0.0.1:9/v1", output_dir=Path("/o"),
                port=5123, max_steps=10, tasks_path=Path("/o/tasks.jsonl"))  # fmt: skip
    fresh = tomllib.loads(configs.orchestrator_toml(profile, **args))
    assert fresh["ckpt"] == {"interval": 2} and "resume" not in fresh
    resumed = tomllib.loads(configs.orchestrator_toml(profile, **args, resume_step=4))
    assert resumed["resume"] == {"step": 4}


def test_overlap_fraction_counts_training_time_with_a_rollout_in_flight():
    training = [(0.0, 10.0), (20.0, 30.0)]
    generation = [(5.0, 8.0), (6.0, 12.0), (25.0, 40.0), (50.0, 60.0)]
    assert records.overlap_fraction(training, generation) == pytest.approx((5.0 + 5.0) / 20.0)
    assert records.overlap_fraction(training, []) == 0.0
    assert records.overlap_fraction([], generation) == 0.0


def test_step_reward_is_prime_rls_effective_reward_and_refuses_two_agents():
    record = {
        "step": 3,
        "primerl/train/agg/effective/default/reward/mean": 0.25,
        "primerl/train/agg/all/default/reward/mean": 0.5,  # the arrival window, not trained on
    }
    assert records.step_reward(record) == 0.25
    assert records.step_reward({"step": 3}) is None
    two = {**record, "primerl/train/agg/effective/other/reward/mean": 1.0}
    with pytest.raises(ValueError, match="more than one agent"):
        records.step_reward(two)


def test_without_prime_rl_the_journey_fails_closed_naming_the_variable_and_writes_nothing(
    monkeypatch, tmp_path
):
    from cortex_recipes.primerl.launch import PrimeRLNotFound
    from recipes.rl.async_grpo import train

    monkeypatch.delenv("CORTEX_RECIPES_PRIMERL_PYTHON", raising=False)
    with pytest.raises(PrimeRLNotFound, match="set CORTEX_RECIPES_PRIMERL_PYTHON"):
        train.main(train.Config(log_path=str(tmp_path / "run")))
    assert not (tmp_path / "run").exists()
    monkeypatch.setenv("CORTEX_RECIPES_PRIMERL_PYTHON", str(tmp_path / "nowhere" / "python"))
    with pytest.raises(PrimeRLNotFound, match="nowhere/python' is not a file"):
        train.main(train.Config(log_path=str(tmp_path / "run")))
    assert not (tmp_path / "run").exists()


def test_a_profile_without_max_off_policy_steps_belongs_to_math_grpo(tmp_path):
    from recipes.rl.async_grpo import train

    sync = "recipes/rl/math_grpo/configs/local-cpu-tiny-qwen3-smoke.json"
    with pytest.raises(train.ProfileError, match="max_off_policy_steps is not set"):
        train.main(train.Config(profile=sync, log_path=str(tmp_path / "run")))


def test_env_latency_reaches_the_taskset_of_both_prime_rl_configs(tmp_path):
    """env.latency_s is the seconds every rollout waits on its environment: the orchestrator's
    and the env-server's taskset tables carry it (absent at 0, the taskset's default)."""
    config = "recipes/rl/async_grpo/configs/local-cpu-smollm2-lora.json"
    tasks = tmp_path / "tasks.jsonl"
    for latency, expected in (("0", None), ("1.5", 1.5)):
        profile = load_grpo_profile(config, [f"env.latency_s={latency}"])
        orch = tomllib.loads(
            configs.orchestrator_toml(
                profile,
                model_dir=Path("/m"),
                base_url="http://127.0.0.1:9/v1",
                output_dir=tmp_path,
                port=5123,
                max_steps=3,
                tasks_path=tasks,
            )  # fmt: skip
        )
        env_server = tomllib.loads(
            configs.env_server_toml(profile, output_dir=tmp_path, port=5123, tasks_path=tasks)
        )
        for taskset in (orch["train"]["source"][0]["env"]["taskset"], env_server["env"]["taskset"]):
            assert taskset.get("latency_s") == expected, (latency, taskset)
            assert taskset["tasks_path"] == str(tasks)


def test_the_taskset_refuses_a_latency_it_cannot_wait(tmp_path):
    """The taskset's own check (loaded by path: verifiers v1 lives only in prime-rl's env)."""
    module = _taskset_module_function("check_latency")
    assert module(2) == 2.0 and module(0.0) == 0.0
    for bad in (-1.0, float("nan"), float("inf"), "2"):
        with pytest.raises(ValueError, match="latency_s="):
            module(bad)


def _taskset_module_function(name: str):
    """One pure function of the taskset package, read from its source without importing
    verifiers (the package's imports are not run; the function's own globals are math only)."""
    import ast
    import math

    source = (journey.tasksets_dir() / "cortex_arith" / "__init__.py").read_text()
    tree = ast.parse(source)
    node = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name)
    namespace: dict = {"math": math}
    exec(compile(ast.Module([node], []), "cortex_arith", "exec"), namespace)  # noqa: S102
    return namespace[name]


def test_the_prime_rl_taskset_takes_a_task_file(tmp_path):
    """env.tasks rows are scored as the taskset scores: the first integer against the answer."""
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(
        '{"question": "Calculate 2 + 3.", "answer": "5"}\n'
        '{"question": "Calculate 9 + 9.", "answer": 18}\n'
    )
    config = "recipes/rl/async_grpo/configs/local-cpu-smollm2-lora.json"
    other = load_grpo_profile(config, [f"env.tasks={tasks}", "env.dataset=chain_sum"])
    configs.check_dataset(other)  # a task file is scoreable whatever env.dataset says
    profile = load_grpo_profile(config, [f"env.tasks={tasks}", "env.size=2"])
    path = configs.write_tasks(profile, tmp_path / "primerl" / "tasks.jsonl")
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert sorted(r["answer"] for r in rows) == ["18", "5"]
    assert {r["partial_credit"] for r in rows} == {False}  # exact answers only, as env.score


def _taskset_scoring():
    """The taskset's reward module, loaded by path (the taskset itself imports verifiers v1,
    which only prime-rl's environment has)."""
    import importlib.util

    path = journey.tasksets_dir() / "cortex_arith" / "scoring.py"
    spec = importlib.util.spec_from_file_location("cortex_arith_scoring", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


REPLIES = [
    "", "no number", "11", "11.1\n\nI added", "8 + 3 = 11", "111", "-11", "1", "The sum is 11.",
    "411", "14", "4", "04", " 12 ",
]  # fmt: skip


@pytest.mark.parametrize("reward", ["dataset", "exact"])
def test_the_taskset_reward_is_what_math_grpo_trains_on(tmp_path, reward):
    """prime-rl's orchestrator must train on Math GRPO's reward, ``env.score``:
    reasoning-gym's partial credit for its problems (a taskset that rewarded exact answers only
    gave prime-rl sparser signal than the loop it is compared with) unless the profile's
    ``env.reward`` is ``exact``, exact answers only for a task file."""
    scoring = _taskset_scoring()
    profile = load_grpo_profile(
        "recipes/rl/async_grpo/configs/local-cpu-smollm2-lora.json", [f"env.reward={reward}"]
    )
    path = configs.write_tasks(profile, tmp_path / "gym" / "tasks.jsonl")
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    env, _ = profile.envs()
    order = task_order(profile.env.seed, env.size)
    partial_seen = False
    for line in range(40):
        task, row = env.task(order[line]), rows[line]
        for reply in [*REPLIES, task.answer, "1" + task.answer, task.answer + "0"]:
            expected = env.score(task, reply)
            assert scoring.score(reply, row["answer"], row["partial_credit"]) == expected, reply
            partial_seen |= 0.0 < expected < 1.0
    # the partial-credit branch was exercised where the reward has one, and never otherwise
    assert partial_seen == (reward == "dataset")

    tasks = tmp_path / "file.jsonl"
    tasks.write_text('{"question": "Calculate 7 + 4.", "answer": "11"}\n')
    config = "recipes/rl/async_grpo/configs/local-cpu-smollm2-lora.json"
    table = load_grpo_profile(config, [f"env.tasks={tasks}", "env.size=1"])
    row = json.loads(configs.write_tasks(table, tmp_path / "t" / "tasks.jsonl").read_text())
    table_env, _ = table.envs()
    for reply in REPLIES:
        expected = table_env.score(table_env.task(0), reply)
        assert scoring.score(reply, row["answer"], row["partial_credit"]) == expected, reply


def test_prime_rl_records_carry_the_shared_grpo_keys():
    """reward/mean and off_policy/* are spelled as Math GRPO spells them, so plots and
    the schema read both runners alike; a fractional lag count fails closed."""
    record = {
        "step": 4,
        "primerl/train/agg/effective/agent/reward/mean": 0.25,
        "primerl/off_policy/mean": 1.5,
        "primerl/off_policy/max": 2.0,
    }
    keys = records.shared_keys(record)
    assert keys == {"reward/mean": 0.25, "off_policy/mean": 1.5, "off_policy/max": 2}
    assert isinstance(keys["off_policy/max"], int)
    assert records.shared_keys({"step": 4}) == {}
    with pytest.raises(ValueError, match=r"primerl/off_policy/max=1.5"):
        records.shared_keys({**record, "primerl/off_policy/max": 1.5})


def test_the_last_prime_rl_record_carries_the_eval_it_ran_first(tmp_path):
    """RunRecorder runs evaluate_last before it writes the last step's record (so the record,
    the schema check and the plots all see eval/accuracy), and only on the last step."""

    class FakeRun:  # the narrow contract RunRecorder uses: record_metrics
        def __init__(self):
            self.records = []

        def record_metrics(self, record, schema):
            assert schema == records.METRICS_SCHEMA
            self.records.append(record)

    (tmp_path / "metrics.jsonl").write_text(
        "".join(
            json.dumps({"step": s, "off_policy/max": 1, "train/agg/effective/a/reward/mean": 0.5})
            + "\n"
            for s in (1, 2)
        )
    )
    calls = []
    run = FakeRun()
    recorder = records.RunRecorder(
        run, tmp_path, interval=10, max_steps=2, state={}, wait_s=0.0,
        evaluate_last=lambda: calls.append("eval") or 0.75,
    )  # fmt: skip
    recorder.save_point = lambda step: True  # resume points are tested in test_primerl_resume
    recorder({"step": 1, "loss": 0.1})
    assert calls == [] and "eval/accuracy" not in run.records[0]
    assert run.records[0]["reward/mean"] == 0.5 and run.records[0]["off_policy/max"] == 1
    recorder({"step": 2, "loss": 0.2})
    assert calls == ["eval"] and run.records[1]["eval/accuracy"] == 0.75


def test_a_backend_that_stops_answering_twice_stops_the_wait_with_its_error():
    """With the backend gone prime-rl's orchestrator retries for ever and the trainer adapter
    waits for a batch that cannot come: the journey's wait must notice by itself."""
    import subprocess
    import sys

    import requests

    lost = requests.exceptions.ConnectionError("refused")
    answers = iter([None, lost, None, lost, lost])
    failures: list = []
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        got = journey._wait(
            sleeper, failures, 60.0, backend_check=lambda: next(answers), check_every_s=0.0
        )
    finally:
        sleeper.kill()
        sleeper.wait()
    assert got is None and failures == [lost]  # one miss is forgiven, two in a row are not
    done = subprocess.Popen([sys.executable, "-c", "pass"])
    assert journey._wait(done, [], 60.0, backend_check=lambda: None) == 0


def test_backend_lost_reports_only_recoverable_errors():
    import requests

    class Client:
        def __init__(self, exc):
            self.exc = exc

        def get_job(self, job_id):
            if self.exc:
                raise self.exc
            return {"job_id": job_id}

    refused = requests.exceptions.ConnectionError("refused")
    assert journey.backend_lost(Client(refused), "job-1") is refused
    assert journey.backend_lost(Client(ValueError("bad job id")), "job-1") is None
    assert journey.backend_lost(Client(None), "job-1") is None


def test_an_exact_reward_gives_no_partial_credit_and_an_unknown_one_is_refused():
    """``env.reward: exact`` scores what the greedy eval counts: a reply whose first integer
    merely contains the answer ("19" for 9, worth 0.5 under reasoning-gym's partial credit, a
    format the CPU profile's policy learned in place of the sums) gets nothing."""
    from cortex_recipes.profiles import ProfileError

    config = "recipes/rl/async_grpo/configs/local-cpu-smollm2-lora.json"
    partial, _ = load_grpo_profile(config, ["env.reward=dataset"]).envs()
    exact, eval_env = load_grpo_profile(config, ["env.reward=exact"]).envs()
    task = next(t for t in map(exact.task, range(50)) if len(t.answer) == 1)
    assert partial.score(task, f"The answer is 1{task.answer}.") == 0.5
    assert exact.score(task, f"The answer is 1{task.answer}.") == 0.0
    assert exact.score(task, f"The answer is {task.answer}.") == 1.0
    assert eval_env.exact  # the eval set is scored the same way
    with pytest.raises(ProfileError, match="env.reward.*'partial'.*dataset, exact"):
        load_grpo_profile(config, ["env.reward=partial"])


def test_math_grpo_refuses_the_version_interpolated_correction_before_anything_starts(tmp_path):
    """An async profile's loglinear proximal policy needs per-rollout versions the synchronous
    loop does not send: one message naming the field, no backend, no run folder."""
    from recipes.rl.math_grpo import train

    config = train.Config(
        log_path=str(tmp_path / "run"),
        overrides=("loss.use_decoupled_loss=true", "loss.prox_logp_method=loglinear"),
    )
    with pytest.raises(train.ProfileError, match="loss.prox_logp_method='loglinear'"):
        train.main(config)
    assert not (tmp_path / "run").exists()
