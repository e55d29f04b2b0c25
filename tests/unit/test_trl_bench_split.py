"""bench/trl_side_by_side.py's pure parts: the phase split, the pair summary, the precision
checks and the in-process stand-in for the sampler's two SDK calls."""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

import pytest

from tests.helpers import load_script

pytestmark = pytest.mark.unit

bench = load_script("bench/trl_side_by_side.py", "trl_side_by_side")


def test_the_split_adds_up_to_the_total_and_takes_the_evaluations_out_of_start_up():
    spans = [
        ("eval", 2.0, 5.0),  # before the first step: not start-up
        ("eval_generate", 3.0, 4.5),  # nested in it: counted nowhere
        ("step", 6.0, 8.0),
        ("step", 8.5, 10.0),
        ("eval", 10.0, 11.0),
        ("save", 11.0, 11.5),
    ]
    split = bench.phase_split(13.0, [2.0, 1.5], spans)
    assert split == {
        "startup_s": 3.0,
        "eval_s": 4.0,
        "train_s": 3.5,
        "save_s": 0.5,
        "other_s": 2.0,
    }
    assert sum(split.values()) == pytest.approx(13.0)


def test_a_save_before_the_first_step_is_not_start_up_either():
    split = bench.phase_split(5.0, [1.0], [("save", 0.5, 1.0), ("step", 2.0, 3.0)])
    assert split["startup_s"] == 1.5 and split["save_s"] == 0.5 and split["other_s"] == 2.0


def test_the_split_needs_a_step():
    with pytest.raises(ValueError, match="no step span"):
        bench.phase_split(1.0, [], [("eval", 0.0, 1.0)])


def test_the_clock_records_a_span_for_a_failed_call_too():
    clock = bench.Clock()

    def fails():
        raise RuntimeError("boom")

    timed = clock.timed("eval", fails)
    with pytest.raises(RuntimeError):
        timed()
    assert [phase for phase, _, _ in clock.spans] == ["eval"]
    assert timed.__name__ == "fails"


def _side(steps, total, spans):
    return bench.side_times(steps, total, spans)


def _pair(project_steps, trl_steps, project_total, trl_total):
    ours = _side(project_steps, project_total, [("step", 1.0, 1.0 + project_steps[0])])
    theirs = _side(trl_steps, trl_total, [("step", 0.5, 0.5 + trl_steps[0])])
    return bench.compare(ours, theirs)


def test_a_pair_compares_warm_medians_first_steps_and_totals():
    pair = _pair([5.0, 2.0, 2.0, 3.0], [3.0, 1.0, 2.0, 2.0], 30.0, 10.0)
    assert pair["project_step_median_s"] == 2.0 and pair["trl_step_median_s"] == 2.0
    assert pair["ratio_project_over_trl"] == 1.0
    assert pair["project_first_step_s"] == 5.0 and pair["trl_first_step_s"] == 3.0
    assert pair["wall_ratio_project_over_trl"] == 3.0
    assert pair["project_phases"]["startup_s"] == 1.0
    assert pair["trl_phases"]["train_s"] == 8.0


def test_the_summary_is_the_median_of_the_pairs_with_the_ratios_range():
    pairs = [
        _pair([5.0, 2.0, 2.0], [3.0, 1.0, 1.0], 30.0, 10.0),
        _pair([5.0, 3.0, 3.0], [3.0, 1.0, 1.0], 40.0, 10.0),
        _pair([5.0, 4.0, 4.0], [3.0, 1.0, 1.0], 20.0, 10.0),
    ]
    summary = bench.summarise(pairs)
    assert summary["pairs_run"] == 3 and len(summary["pairs"]) == 3
    assert summary["ratio_project_over_trl"] == 3.0
    assert summary["ratio_range_project_over_trl"] == [2.0, 4.0]
    assert summary["wall_ratio_project_over_trl"] == 3.0
    assert summary["wall_ratio_range_project_over_trl"] == [2.0, 4.0]
    assert summary["project_total_s"] == 30.0
    assert set(summary["project_phases"]) == set(bench.PHASES)
    assert summary["trl_phases"]["startup_s"] == 0.5


def test_the_recipes_alone_are_summarised_by_their_medians_and_the_gpu_check_keeps_those():
    runs = [
        bench.side_times([4.0, 2.0, 2.0], 20.0, [("step", 5.0, 9.0), ("eval", 1.0, 4.0)]),
        bench.side_times([6.0, 3.0, 3.0], 30.0, [("step", 6.0, 12.0), ("eval", 1.0, 5.0)]),
        bench.side_times([5.0, 4.0, 4.0], 25.0, [("step", 7.0, 12.0), ("eval", 2.0, 6.0)]),
    ]
    summary = bench.summarise_project(runs)
    assert summary["runs"] == 3 and len(summary["each"]) == 3
    assert summary["step_median_s"] == 3.0  # the warm steps' medians 2, 3, 4
    assert summary["first_step_s"] == 5.0 and summary["total_s"] == 25.0
    assert summary["phases"]["train_s"] == 12.0 and summary["phases"]["eval_s"] == 4.0
    assert set(summary["phases"]) == set(bench.PHASES)
    check = load_script("bench/gpu_check.py", "gpu_check")
    kept = check.split_summary(
        {"work": "/tmp/x", "result": {"steps": 4, "sft": {"profile": "p", **summary}}}
    )
    assert set(kept) == {"sft"} and "each" not in kept["sft"]
    assert kept["sft"]["phases"] == summary["phases"] and kept["sft"]["profile"] == "p"


def test_pairs_alternate_which_side_goes_first():
    order = []

    def side(name):
        def run():
            order.append(name)
            return _side([1.0, 1.0], 3.0, [("step", 0.0, 1.0)])

        return run

    bench.run_pair(0, side("project"), side("trl"))
    bench.run_pair(1, side("project"), side("trl"))
    assert order == ["project", "trl", "trl", "project"]


def test_both_sides_evaluations_read_alike():
    sft = {
        "held_out_hits": 2,
        "held_out_total": 3,
        "controls": [{"ok": True}, {"ok": False}],
        "held_out": [],
    }
    assert bench.eval_summary(sft) == {
        "held_out_hits": 2,
        "held_out_total": 3,
        "controls_kept": 1,
    }
    assert bench.eval_summary({"accuracy": 0.123456, "score": 0.2}) == {"accuracy": 0.1235}
    summary = {"eval_before": sft, "eval_after": {**sft, "held_out_hits": 3}}
    assert [e["step"] for e in bench.recipe_evaluations(summary, 4)] == [0, 4]
    grpo = {"eval_accuracy": [{"step": 0, "accuracy": 0.5, "correct": [1, 0]}]}
    assert bench.recipe_evaluations(grpo, 4) == [{"step": 0, "accuracy": 0.5}]


def test_generated_ids_stop_after_the_first_stop_id():
    assert bench.until_stop([5, 6, 2, 2, 2], {2}) == [5, 6, 2]
    assert bench.until_stop([5, 6, 7], {2}) == [5, 6, 7]


def _job(dtype, worker=None, job_type="training"):
    sub = {"sub_job_id": "s1", "job_type": job_type, "dtype": dtype}
    if worker:
        sub["info"] = {"dtype": worker}
    return {"sub_jobs": [sub]}


def test_the_backend_precision_check_accepts_only_the_asked_dtype():
    seen = bench.backend_precision(
        [_job("float32", "float32"), _job("float32", "float32"), _job("float32", None, "sampling")],
        "float32",
    )
    assert seen["dtype"] == "float32" and len(seen["sub_jobs"]) == 2
    with pytest.raises(RuntimeError, match="bfloat16"):
        bench.backend_precision([_job("float32", "bfloat16")], "float32")
    with pytest.raises(RuntimeError, match="no sub-job"):
        bench.backend_precision([], "float32")


def _trainer(bf16, mixed, frozen, trainable):
    import torch

    params = [
        torch.nn.Parameter(torch.zeros(1, dtype=frozen), requires_grad=False),
        torch.nn.Parameter(torch.zeros(1, dtype=trainable)),
    ]
    return SimpleNamespace(
        accelerator=SimpleNamespace(mixed_precision=mixed),
        args=SimpleNamespace(bf16=bf16, fp16=False),
        model=SimpleNamespace(parameters=lambda: iter(params)),
    )


def test_the_trl_precision_check():
    import torch

    f32, bf16 = torch.float32, torch.bfloat16
    fp32 = bench.trl_precision(_trainer(False, "no", f32, f32), "float32")
    assert fp32["frozen_dtypes"] == ["float32"] and fp32["mixed_precision"] == "no"
    mixed = bench.trl_precision(_trainer(True, "bf16", bf16, f32), "bfloat16")
    assert mixed["trainable_dtypes"] == ["float32"]
    with pytest.raises(RuntimeError, match="args_bf16"):
        bench.trl_precision(_trainer(True, "bf16", f32, f32), "float32")
    with pytest.raises(RuntimeError, match="frozen_dtypes"):
        bench.trl_precision(_trainer(False, "no", bf16, f32), "float32")


def test_patched_puts_back_what_was_there():
    class Owner:
        def kept(self):
            return "kept"

    class Child(Owner):
        pass

    with bench.patched([(Owner, "kept", lambda self: "new"), (Child, "kept", lambda self: "c")]):
        assert Owner().kept() == "new" and Child().kept() == "c"
    assert Owner().kept() == "kept" and Child().kept() == "kept"
    assert "kept" not in vars(Child)


def test_the_in_process_sampler_left_pads_and_answers_like_the_backend():
    import torch

    seen = {}

    class Model:
        training = True
        config = SimpleNamespace(eos_token_id=[2, 3])

        def eval(self):
            self.training = False

        def train(self, mode=True):
            self.training = mode

        def generate(self, input_ids, attention_mask, generation_config):
            seen.update(ids=input_ids.tolist(), mask=attention_mask.tolist())
            seen["config"] = generation_config
            seen["training"] = self.training
            new = torch.tensor([[7, 3, 0], [8, 9, 10]])
            return torch.cat([input_ids, new], dim=1)

    model = Model()
    sampler = bench.InProcessSampler(
        model, SimpleNamespace(eos_token_id=2), 0, contextlib.nullcontext
    )
    request = sampler.generate("job", [[11, 12], [13]], {"max_tokens": 3, "temperature": 0.0})
    results = sampler.poll_request("job", request)["results"]
    assert seen["ids"] == [[11, 12], [0, 13]] and seen["mask"] == [[1, 1], [0, 1]]
    assert seen["config"].do_sample is False and seen["config"].max_new_tokens == 3
    assert sorted(seen["config"].eos_token_id) == [2, 3]
    assert seen["training"] is False and model.training is True
    assert [r["token_ids"] for r in results] == [[7, 3], [8, 9, 10]]
    with pytest.raises(ValueError, match="greedy"):
        sampler.generate("job", [[1]], {"max_tokens": 1, "temperature": 1.0})


def test_the_profiles_take_either_precision():
    assert bench.overrides_for("fp32") == ()
    assert bench.overrides_for("bf16") == ("dtype=bfloat16",)
    assert bench.check_profiles("fp32") is None
    assert bench.check_profiles("bf16") is None
