"""Training a head on a GPU with the frozen target placed by ``device_map="auto"`` and the step in bf16
(issue 57): ``hf-cascade train ... --target-device-map auto --mixed-precision bf16`` through the command line,
for every head. The target stays where the map put it, the head trains on the device of the target's output
layer, the loss falls, and the saved head reloads on the CPU with float32 weights.

Skipped without CUDA (tests/cuda/conftest.py marks them ``cuda``); the CPU side of the same plumbing:
tests/test_training_parallel.py.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from hf_cascade.bench.loading import load_model
from hf_cascade.cli import main
from hf_cascade.loading import load_head
from tests import tiny_models as tm
from tests.test_training import distilled, target  # noqa: F401  (fixtures: tiny Llama target + its store)
from tests.tiny_models import single_thread  # noqa: F401  (autouse fixture)


@pytest.fixture(scope="module")
def target_dir(target, tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-target")
    target.save_pretrained(path)
    tm.word_tokenizer().save_pretrained(path)
    return path


@pytest.mark.parametrize(
    "head, flags",
    [("vanilla", ["--preset", "xs"]), ("glide", ["--target-layers", "0"]), ("redrafter", ["--preset", "xs"])],
)
def test_bf16_training_with_the_target_on_device_map_auto(head, flags, target_dir, distilled, tmp_path, monkeypatch):
    import hf_cascade.bench.loading as loading

    placed = {}

    def load(spec, **kw):
        model, tok = load_model(spec, **kw)
        placed.update(device_map=kw.get("device_map"), hf_device_map=dict(model.hf_device_map), model=model)
        return model, tok

    monkeypatch.setattr(loading, "load_model", load)
    out = tmp_path / head
    argv = [
        "train",
        head,
        *flags,
        "--target",
        str(target_dir),
        "--data",
        str(distilled[2].out),
        "--out",
        str(out),
        "--steps",
        "8",
        "--batch-size",
        "4",
        "--grad-accum",
        "2",
        "--max-len",
        "48",
        "--lr",
        "2e-2",
        "--eval-every",
        "4",
        "--eval-records",
        "2",
        "--draft-vocab",
        "64",
        "--mixed-precision",
        "bf16",
        "--target-device-map",
        "auto",
        "--checkpoint-every",
        "4",
        "--no-progress",
    ]
    assert main(argv) == 0
    assert placed["device_map"] == "auto"
    assert {
        torch.device(d if not isinstance(d, int) else f"cuda:{d}").type for d in placed["hf_device_map"].values()
    } == {"cuda"}
    assert placed["model"].get_output_embeddings().weight.device.type == "cuda"  # not moved by the trainer
    state = json.loads((out / "trainer_state.json").read_text())
    losses = [h["loss"] for h in state["history"] if "loss" in h]
    assert state["step"] == 8 and all(np.isfinite(losses)) and np.mean(losses[-3:]) < np.mean(losses[:3]), losses
    assert not (out / "checkpoint").exists()
    reloaded = load_head(out)
    assert all(p.dtype == torch.float32 and p.device.type == "cpu" for p in reloaded.parameters())


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
@pytest.mark.parametrize("shard", [[], ["--fsdp"]], ids=["ddp", "fsdp"])
def test_two_processes_each_shard_their_target_over_their_own_gpus(shard, target_dir, distilled, tmp_path, monkeypatch):
    """``--num-processes 2 --target-device-map auto`` (NCCL): each process loads its target over every second GPU
    from its own (:func:`hf_cascade.training.accel.process_gpus`) and DDP trains the head on the process's GPU; the
    GLIDE loss reads the target's cache from another GPU where the map put it there. The CPU side of the same
    plumbing: tests/test_training_parallel.py (golden GPU subsets, and a 2-process CPU run resumed with the map).
    ``--fsdp``: the head sharded over the 2 processes (NCCL reduce-scatter), bf16 autocast."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    monkeypatch.setenv("PYTHONPATH", str(root))
    out = tmp_path / "glide"
    argv = [
        "train",
        "glide",
        "--target-layers",
        "0",
        "--target",
        str(target_dir),
        "--data",
        str(distilled[2].out),
        "--out",
        str(out),
        "--steps",
        "8",
        "--batch-size",
        "4",
        "--max-len",
        "48",
        "--lr",
        "2e-2",
        "--eval-every",
        "4",
        "--eval-records",
        "2",
        "--draft-vocab",
        "64",
        "--mixed-precision",
        "bf16",
        "--target-device-map",
        "auto",
        "--num-processes",
        "2",
        "--no-progress",
        *shard,
    ]
    assert main(argv) == 0
    state = json.loads((out / "trainer_state.json").read_text())
    losses = [h["loss"] for h in state["history"] if "loss" in h]
    assert state["processes"] == 2 and state["step"] == 8 and all(np.isfinite(losses)), losses
    assert np.mean(losses[-3:]) < np.mean(losses[:3]), losses
