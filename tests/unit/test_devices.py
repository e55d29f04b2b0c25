"""Device selection and placement of sub-jobs (no GPU needed: CUDA counts are parameters)."""

from __future__ import annotations

import pytest

from cortex_recipes.local import devices
from cortex_recipes.local.devices import PlacementRequest, plan_placement
from cortex_recipes.local.errors import BackendError

pytestmark = pytest.mark.unit

TRAIN = PlacementRequest("j:training:0", "training", 1)
SAMPLE = PlacementRequest("j:sampling:0", "sampling", 1)
TEACHER = PlacementRequest("j:log_prob:0", "log_probability", 1)


def test_mode_comes_from_the_argument_then_the_environment_then_auto(monkeypatch):
    monkeypatch.delenv(devices.DEVICE_ENV, raising=False)
    assert devices.device_mode(None) == "auto"
    monkeypatch.setenv(devices.DEVICE_ENV, "CPU")
    assert devices.device_mode(None) == "cpu"
    assert devices.device_mode("cuda") == "cuda"
    monkeypatch.setenv(devices.DEVICE_ENV, "tpu")
    with pytest.raises(ValueError, match="CORTEX_RECIPES_DEVICE='tpu'; accepted: auto, cpu, cuda"):
        devices.device_mode(None)
    with pytest.raises(ValueError, match="device='gpu'"):
        devices.device_mode("gpu")


def test_auto_without_cuda_places_everything_on_the_cpu():
    plan = plan_placement([TRAIN, SAMPLE], "auto", cuda_count=0)
    assert plan == {TRAIN.sub_job_id: "cpu", SAMPLE.sub_job_id: "cpu"}


def test_cpu_mode_ignores_visible_gpus():
    assert set(plan_placement([TRAIN, SAMPLE], "cpu", cuda_count=4).values()) == {"cpu"}


def test_cuda_mode_without_cuda_is_a_clear_error():
    with pytest.raises(BackendError, match="device='cuda' was asked for but this machine has no"):
        plan_placement([TRAIN], "cuda", cuda_count=0)


def test_one_gpu_is_shared_by_every_sub_job():
    plan = plan_placement([SAMPLE, TRAIN, TEACHER], "auto", cuda_count=1)
    assert set(plan.values()) == {"cuda:0"}


def test_several_gpus_get_distinct_devices_trainer_first():
    # The trainer is listed last but placed first, on the least-loaded GPU.
    plan = plan_placement([SAMPLE, TEACHER, TRAIN], "auto", cuda_count=3)
    assert plan == {
        TRAIN.sub_job_id: "cuda:0",
        SAMPLE.sub_job_id: "cuda:1",
        TEACHER.sub_job_id: "cuda:2",
    }
    # Two GPUs for three sub-jobs: the third shares the least-loaded one.
    assert plan_placement([TRAIN, SAMPLE, TEACHER], "auto", cuda_count=2) == {
        TRAIN.sub_job_id: "cuda:0",
        SAMPLE.sub_job_id: "cuda:1",
        TEACHER.sub_job_id: "cuda:0",
    }


def test_placement_avoids_gpus_that_earlier_jobs_hold():
    plan = plan_placement([TRAIN, SAMPLE], "auto", cuda_count=2, in_use={0: 2, 1: 1})
    assert plan == {TRAIN.sub_job_id: "cuda:1", SAMPLE.sub_job_id: "cuda:0"}


def test_auto_keeps_a_sub_job_that_asks_for_no_gpu_on_the_cpu():
    cpu_only = PlacementRequest("j:sampling:0", "sampling", 0)
    assert plan_placement([TRAIN, cpu_only], "auto", cuda_count=1) == {
        TRAIN.sub_job_id: "cuda:0",
        cpu_only.sub_job_id: "cpu",
    }
    assert plan_placement([cpu_only], "cuda", cuda_count=1) == {cpu_only.sub_job_id: "cuda:0"}


def test_worker_sees_only_its_own_gpu_in_the_servers_numbering():
    assert devices.worker_visible_devices("cpu", None) == ""
    assert devices.worker_visible_devices("cuda:1", None) == "1"
    assert devices.worker_visible_devices("cuda:1", "4,6") == "6"
    with pytest.raises(ValueError, match="not in CUDA_VISIBLE_DEVICES"):
        devices.worker_visible_devices("cuda:2", "4,6")


def test_dtype_defaults_to_bf16_on_a_gpu_and_fp32_on_the_cpu_and_an_explicit_one_wins():
    assert devices.resolve_dtype(None, "cuda:0") == "bfloat16"
    assert devices.resolve_dtype(None, "cpu") == "float32"
    assert devices.resolve_dtype("float32", "cuda:0") == "float32"
    assert devices.resolve_dtype("bfloat16", "cpu") == "bfloat16"
