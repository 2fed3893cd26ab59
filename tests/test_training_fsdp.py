"""FSDP in training (hf_cascade.training.sharding): which settings of accelerate's are honoured, the target loaded
whole in every process, checkpoints resumed only as written, and fp16 in 2 processes (gloo) on the 1-process curve.
The 2-process DDP / FSDP run of every head, interrupted and resumed: tests/test_training_parallel.py."""

from __future__ import annotations

import dataclasses
import json
import os

import pytest
import torch

from hf_cascade.training.run_glide import GLIDE_PRESETS, train_glide
from tests import tiny_models as tm
from tests.test_training import distilled, target  # noqa: F401  (fixtures: tiny target + store)
from tests.test_training_parallel import _cfg, _launch, _losses
from tests.tiny_models import single_thread  # noqa: F401  (autouse fixture)


def test_deepspeed_is_refused_and_fsdp_left_to_the_loop(monkeypatch):
    """accelerate's FSDP request is the loop's (hf_cascade.training.sharding): the Accelerator is built without it
    (its FSDP plugin raises on a CPU) and the request is back in the environment afterwards; DeepSpeed is refused."""
    import accelerate
    from accelerate.utils import DistributedType

    from hf_cascade.training.accel import accelerator

    seen = {}

    class Fake:
        kind = DistributedType.DEEPSPEED

        def __init__(self, **kw):
            seen["fsdp"] = os.environ.get("ACCELERATE_USE_FSDP")
            self.distributed_type = Fake.kind

    monkeypatch.setattr(accelerate, "Accelerator", Fake)
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    with pytest.raises(ValueError, match="config asks for DEEPSPEED: hf-cascade trains heads data parallel"):
        accelerator()
    Fake.kind = DistributedType.NO
    assert accelerator().distributed_type == DistributedType.NO
    assert seen["fsdp"] is None and os.environ["ACCELERATE_USE_FSDP"] == "true"


def test_the_target_loads_whole_in_every_process_of_an_fsdp_launch(monkeypatch):
    """Under ``accelerate launch --use_fsdp`` (its default ``cpu_ram_efficient_loading``), transformers would load the
    target's weights in the first process only (seen on 4.57: the others trained against uninitialised memory, NaN):
    the commands load it with the FSDP request hidden, and put it back."""
    import hf_cascade.bench.loading as loading
    from hf_cascade.cli import _load_target

    seen = []
    monkeypatch.setattr(loading, "load_model", lambda spec, **kw: seen.append(os.environ.get("ACCELERATE_USE_FSDP")))
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    monkeypatch.setenv("FSDP_CPU_RAM_EFFICIENT_LOADING", "true")
    _load_target("tiny", None)
    _load_target("tiny", "auto")
    assert seen == [None, None] and os.environ["ACCELERATE_USE_FSDP"] == "true"


def test_fsdp_settings_from_accelerates_environment():
    """Golden values: what accelerate's FSDP launch exports (FSDP2's reshard flag, FSDP1's strategy names) and
    ``--fsdp``; one process or NO_SHARD: plain data parallel; hybrid sharding: a clear error."""
    from hf_cascade.training.sharding import FsdpSettings, requested

    on = {"ACCELERATE_USE_FSDP": "true"}
    assert requested(False, 2, {}) is None and requested(True, 1, {}) is None and requested(False, 1, on) is None
    assert requested(True, 2, {}) == FsdpSettings(True, False)
    assert requested(False, 2, {**on, "FSDP_RESHARD_AFTER_FORWARD": "false"}) == FsdpSettings(False, False)
    assert requested(
        False, 8, {**on, "FSDP_RESHARD_AFTER_FORWARD": "true", "FSDP_OFFLOAD_PARAMS": "true"}
    ) == FsdpSettings(True, True)
    v1 = {**on, "FSDP_VERSION": "1", "FSDP_RESHARD_AFTER_FORWARD": "true"}
    assert requested(False, 2, {**v1, "FSDP_SHARDING_STRATEGY": "SHARD_GRAD_OP"}) == FsdpSettings(False, False)
    assert requested(False, 2, {**v1, "FSDP_SHARDING_STRATEGY": "1"}) == FsdpSettings(True, False)
    assert requested(False, 2, {**v1, "FSDP_SHARDING_STRATEGY": "NO_SHARD"}) is None
    with pytest.raises(ValueError, match="sharding strategy HYBRID_SHARD: hf-cascade shards a head over all"):
        requested(False, 2, {**v1, "FSDP_SHARDING_STRATEGY": "HYBRID_SHARD"})


def test_a_checkpoint_resumes_only_as_it_was_written(tmp_path):
    from types import SimpleNamespace

    from hf_cascade.training.accel import load_checkpoint

    acc = SimpleNamespace(num_processes=1, load_state=lambda path: pytest.fail("loaded"))
    (tmp_path / "checkpoint" / "sharded").mkdir(parents=True)
    (tmp_path / "checkpoint" / "random_states_0.pkl").touch()
    with pytest.raises(ValueError, match="written by a run with FSDP .* resume it the same way"):
        load_checkpoint(acc, tmp_path)
    (tmp_path / "checkpoint" / "sharded").rmdir()
    with pytest.raises(ValueError, match="written by a run without FSDP; resume it the same way"):
        load_checkpoint(acc, tmp_path, shards=(None, None))


def test_fsdp_in_two_processes_with_fp16_follows_one_process(distilled, target, tmp_path):
    """FSDP asked by ``--fsdp`` rather than accelerate's config, with fp16 autocast: the sharded gradient scaler (every
    process skips the same steps) and the sharded head give the 1-process run's curve and head, float16 rounding aside
    (the processes reduce the halves' gradients in another order than one process's accumulation); the head saved in Hub
    layout is gathered whole from the shards."""
    tiny = tmp_path / "tiny"
    target.save_pretrained(tiny)
    tm.word_tokenizer().save_pretrained(tiny)
    out = tmp_path / "fsdp"
    argv = [
        "train",
        "glide",
        "--target-layers",
        "0",
        "--target",
        str(tiny),
        "--data",
        str(distilled[2].out),
        "--out",
        str(out),
        "--draft-vocab",
        "64",
        "--steps",
        "4",
        "--batch-size",
        "4",
        "--max-len",
        "48",
        "--lr",
        "5e-2",
        "--eval-every",
        "4",
        "--eval-records",
        "2",
        "--mixed-precision",
        "fp16",
        "--no-progress",
        "--fsdp",
    ]
    done = _launch(argv, tmp_path, "ddp")  # FSDP asked by --fsdp (what --num-processes runs)
    assert done.returncode == 0, done.stderr[-3000:]
    two = json.loads((out / "trainer_state.json").read_text())
    assert two["processes"] == 2 and two["config"]["mixed_precision"] == "fp16"
    layout = two["layout"]  # the main process holds about half of the head
    assert layout["fsdp"] and 0.4 < layout["parameters_here"] / layout["head_parameters"] < 0.6, layout
    torch.manual_seed(0)
    spec = dataclasses.replace(GLIDE_PRESETS["xs"], draft_vocab_size=64, target_layer_ids=(0,))
    cfg = _cfg(
        tmp_path / "one",
        steps=4,
        batch_size=4,
        max_len=48,
        eval_every=4,
        grad_accum=2,
        warmup=30,
        mixed_precision="fp16",
    )
    _, one = train_glide(target, distilled[2].out, cfg, spec, target_name=str(tiny), command="x", progress=False)
    assert [h["loss"] for h in two["history"] if "loss" in h] == pytest.approx(_losses(one), rel=2e-3)
    from safetensors.torch import load_file

    saved, whole = load_file(out / "model.safetensors"), load_file(tmp_path / "one" / "model.safetensors")
    assert saved.keys() == whole.keys()  # the head gathered from its shards, saved whole
    for name in saved:  # fp16 rounding moves Adam's steps by <= 2e-3 here; an untrained head is 0.1 away
        torch.testing.assert_close(saved[name], whole[name], atol=5e-3, rtol=0, msg=name)
