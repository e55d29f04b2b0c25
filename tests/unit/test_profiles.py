"""The one profile layer (cortex_recipes.profiles): typed sections, overrides, help, stable hashes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cortex_recipes import profiles
from cortex_recipes.distill.opd_profile import load_opd_profile
from cortex_recipes.journeys import load_journeys, profile_loader
from cortex_recipes.profiles import ProfileError
from cortex_recipes.rl.grpo_profile import GRPOProfile, load_grpo_profile
from cortex_recipes.sft import SFTProfile, load_profile
from cortex_recipes.tito.tito_profile import load_tito_profile

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
ASYNC = ROOT / "recipes/rl/async_grpo/configs/local-cpu-smollm2-lora.json"
SFT_LORA = ROOT / "recipes/sft/conversational/configs/local-cpu-smollm2-lora.json"
SFT_TINY = ROOT / "recipes/sft/conversational/configs/local-cpu-tiny-qwen3.json"
CHECKED_IN = [
    (journey, config)
    for journey in load_journeys(ROOT)
    for config in sorted((ROOT / journey.folder / "configs").glob("*.json"))
]


@pytest.mark.parametrize(
    ("journey", "config"), CHECKED_IN, ids=lambda x: getattr(x, "stem", getattr(x, "name", x))
)
def test_every_checked_in_profile_loads_typed_and_keeps_the_hash_of_its_file(journey, config):
    profile = profile_loader(journey)(config)
    assert profile.config_hash == profiles.config_hash(json.loads(config.read_text()))
    for sub_job in profile.sub_jobs():
        sub_job.validate()


def test_nested_overrides_reach_typed_fields_and_change_the_hash():
    base = load_grpo_profile(ASYNC)
    profile = load_grpo_profile(
        ASYNC,
        ["learning_rate=1e-4", "eval.max_tokens=32", "orchestrator.sampling.top_p=0.9"],
    )
    assert profile.learning_rate == 1e-4 and profile.eval.max_tokens == 32
    assert profile.sampling_params()["top_p"] == 0.9
    assert profile.sub_jobs()[0].to_wire()["training_config"]["optimizer"]["lr"] == 1e-4
    assert profile.raw["learning_rate"] == 1e-4 != base.raw["learning_rate"]
    assert profile.config_hash != base.config_hash
    assert load_grpo_profile(ASYNC, []).config_hash == base.config_hash


def test_overrides_inside_a_free_form_block_are_kept_as_given():
    profile = load_grpo_profile(ASYNC, ["training.peft_config.r=4"])
    assert profile.training["peft_config"]["r"] == 4
    assert profile.sub_jobs()[1].to_wire()["inference_config"]["peft_config"]["r"] == 4


@pytest.mark.parametrize(
    ("override", "message"),
    [
        (
            "loss.eps_clp=1",
            r"loss.eps_clp is not a field of loss; accepted: "
            r"behav_imp_weight_cap, c_clip, entropy_coeff, eps_clip, eps_clip_higher, "
            r"importance_sampling_level, is_weight_clip_max, loss_agg_mode, m2_threshold, "
            r"prox_logp_method, use_cispo_loss, use_decoupled_loss, use_sapo_loss",
        ),
        ("speed=3", r"speed is not a field of the profile; accepted: .*steps"),
        ("learning_rate=-1", r"learning_rate=-1.0 must be > 0"),
        ("orchestrator.batch_size=many", r"orchestrator.batch_size='many' must be int"),
        ("weight_format=vllm", r"weight_format='vllm'; accepted: hf, lora"),
        ("steps.value=3", r"steps is a int, not a section"),
        ("steps", r"override 'steps' must look like key=value"),
    ],
)
def test_a_wrong_override_names_the_field_the_value_and_what_is_accepted(override, message):
    with pytest.raises(ProfileError, match=message):
        load_grpo_profile(ASYNC, [override])


def test_sft_eval_section_overrides_and_required_fields():
    assert load_profile(SFT_LORA, ["eval.max_tokens=32"]).eval.max_tokens == 32
    assert load_profile(SFT_TINY).eval is None
    with pytest.raises(ProfileError, match=r"eval.prompts is required"):
        load_profile(SFT_TINY, ["eval.max_tokens=32"])  # a new section needs its fields


def test_other_journeys_accept_nested_overrides_too():
    tito = ROOT / "recipes/agentic/tito/configs/local-cpu-tiny-qwen3-smoke.json"
    assert load_tito_profile(tito, ["steps=2", "warm_start.steps=0"]).steps == 2
    opd = ROOT / "recipes/distillation/on_policy/configs/local-cpu-smollm2-teacher.json"
    assert load_opd_profile(opd, ["teacher_tau=0.5"]).loss_config()["teacher_tau"] == 0.5
    with pytest.raises(ProfileError, match=r"teacher_tau=0.5 needs a positive teacher_clip"):
        load_opd_profile(opd, ["teacher_tau=0.5", "teacher_clip=null"])


def test_a_toml_profile_loads_like_the_json_one_with_the_same_hash(tmp_path):
    configs = tmp_path / "configs"
    configs.mkdir()
    toml = configs / "local-cpu-tiny-qwen3.toml"
    toml.write_text(
        'name = "local-cpu-tiny-qwen3"\n'
        'description = "Smoke profile: random-init tiny Qwen3 on CPU; checks the plumbing, '
        'not the outcome."\n'
        'model = "tiny-qwen3"\nrenderer = "qwen3"\ntrain_on = "all_assistant_messages"\n'
        'dataset = "data/identity.jsonl"\nseed = 0\nn_gpus = 1\nmax_seq_len = 128\n'
        'batch_size = 4\nsteps = 3\nlearning_rate = 0.001\ndtype = "float32"\n\n[training]\n'
    )
    assert load_profile(toml).config_hash == load_profile(SFT_TINY).config_hash


def test_help_lists_every_profile_field_with_its_doc_and_default():
    text = profiles.help_text(GRPOProfile)
    assert "learning_rate" in text and "AdamW learning rate of those steps (> 0)" in text
    assert "eval.interval" in text and "default 5" in text
    assert "orchestrator.sampling.temperature" in text
    names = [row[0] for row in profiles.describe(SFTProfile)]
    assert "eval.max_tokens" in names and "path" not in names and "raw" not in names


def test_the_command_line_splits_journey_settings_from_profile_overrides(capsys):
    from recipes.sft.conversational.train import Config

    config = profiles.entrypoint(
        Config, SFTProfile, ["steps=2", "learning_rate=1e-4", "eval.max_tokens=32"]
    )
    assert config.steps == 2
    assert config.overrides == ("learning_rate=1e-4", "eval.max_tokens=32")
    with pytest.raises(SystemExit) as exited:
        profiles.entrypoint(Config, SFTProfile, ["--help"])
    assert exited.value.code == 0
    out = capsys.readouterr().out
    assert "if_exists" in out and "resume | overwrite | fail" in out
    assert "learning_rate" in out and "eval.max_tokens" in out


def test_grpo_lr_schedule_constant_and_linear():
    """lr_schedule: constant keeps learning_rate; linear steps it down by lr/steps a step, the
    same rule the sync loop and the async trainer adapter send with each step."""
    from cortex_recipes.primerl.trainer import TrainerAdapter, TrainerAdapterConfig
    from cortex_recipes.rl.grpo_profile import scheduled_learning_rate

    constant = load_grpo_profile(ASYNC, ["learning_rate=0.002", "lr_schedule=constant"])
    assert [constant.learning_rate_at(s, 4) for s in (1, 2, 3, 4)] == [0.002] * 4
    linear = load_grpo_profile(ASYNC, ["learning_rate=0.002", "lr_schedule=linear"])
    assert [linear.learning_rate_at(s, 4) for s in (1, 2, 3, 4)] == pytest.approx(
        [0.002, 0.0015, 0.001, 0.0005], abs=1e-15
    )
    adapter = TrainerAdapter(
        None,
        TrainerAdapterConfig(
            output_dir=Path("/nowhere"),
            job_id="j",
            max_steps=4,
            pad_id=0,
            learning_rate=0.002,
            lr_schedule="linear",
        ),  # fmt: skip
    )
    assert [adapter.learning_rate(s) for s in (1, 4)] == [
        linear.learning_rate_at(s, 4) for s in (1, 4)
    ]
    unset = TrainerAdapter(
        None, TrainerAdapterConfig(output_dir=Path("/o"), job_id="j", max_steps=4, pad_id=0)
    )
    assert unset.learning_rate(2) is None  # the job's optimizer lr
    with pytest.raises(ProfileError, match="lr_schedule"):
        load_grpo_profile(ASYNC, ["lr_schedule=cosine"])
    for bad_step in (0, 5):
        with pytest.raises(ValueError, match=f"step={bad_step} is outside 1..4"):
            scheduled_learning_rate(0.1, "linear", bad_step, 4)
