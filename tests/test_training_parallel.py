"""Training on accelerate (hf_cascade.training.loop / .accel / .batches): one process reproduces the loss
curve of the loop before accelerate (golden values), the global batch splits over processes and micro-batches,
an interrupted run resumes to the same end, and a 2-process CPU run (``accelerate launch --multi_gpu
--num_processes 2`` with ``ACCELERATE_USE_CPU``: gloo; accelerate's own ``--cpu`` launch flag starts a single
process), interrupted and resumed, follows the 1-process run of the same total batch; ``distill`` in 2 processes
shards its prompts and merges them into one store; bf16 / fp16, ``--grad-accum`` and ``--target-device-map``
through the command line, and each process's own GPUs for a mapped target. The 2-process run is made with DDP and
with FSDP; FSDP's own tests: tests/test_training_fsdp.py."""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import hf_cascade.training.run as run
from hf_cascade.training import DistillStore
from hf_cascade.training.batches import BatchStream, make_batch
from hf_cascade.training.loop import TrainConfig
from hf_cascade.training.run import PRESETS, train_vanilla
from hf_cascade.training.run_glide import GLIDE_PRESETS, GlideSpec, train_glide
from hf_cascade.training.run_redrafter import PRESETS as REDRAFTER_PRESETS
from hf_cascade.training.run_redrafter import ReDrafterSpec, train_redrafter
from tests import tiny_models as tm
from tests.launch_train import Interrupted, failing_at
from tests.test_training import PROMPTS, SPEC, distilled, target  # noqa: F401  (fixtures: tiny target + store)
from tests.tiny_models import single_thread  # noqa: F401  (autouse fixture)

ROOT = Path(__file__).resolve().parents[1]
GLIDE = GlideSpec(
    hidden_size=16, intermediate_size=32, num_attention_heads=2, num_key_value_heads=1, head_dim=8, draft_vocab_size=64
)
REDRAFTER = ReDrafterSpec(exit_dim=24, num_draft_layers=1, draft_vocab_size=64, beam_length=3)

# Recorded with the loop before it ran on accelerate (commit cf72632), on the `distilled` fixture's store:
# TrainConfig(steps=6, batch_size=2, eval_every=3, eval_records=2, max_len=64, lr=5e-2, warmup=1), seed 0.
GOLDEN = {
    "vanilla": [
        4.158161163330078,
        3.8807730674743652,
        3.6428842544555664,
        3.0281715393066406,
        2.509669780731201,
        3.333343744277954,
    ],
    "glide": [
        4.176150798797607,
        4.010047435760498,
        4.044524669647217,
        3.2566137313842773,
        2.83774995803833,
        3.1534600257873535,
    ],
    "redrafter": [
        12.4746732711792,
        12.14712142944336,
        10.11429214477539,
        6.237914562225342,
        5.755622863769531,
        10.958134651184082,
    ],
}


def _cfg(out, **kw) -> TrainConfig:
    return TrainConfig(
        out,
        **{
            "steps": 6,
            "batch_size": 2,
            "eval_every": 3,
            "eval_records": 2,
            "max_len": 64,
            "lr": 5e-2,
            "warmup": 1,
            **kw,
        },
    )


def _losses(state) -> list[float]:
    return [h["loss"] for h in state.history if "loss" in h]


@pytest.mark.parametrize(
    "head, fn, spec",
    [("vanilla", train_vanilla, SPEC), ("glide", train_glide, GLIDE), ("redrafter", train_redrafter, REDRAFTER)],
)
def test_one_process_reproduces_the_loss_curve_before_accelerate(head, fn, spec, distilled, target, tmp_path):
    torch.manual_seed(0)
    _, state = fn(
        target, distilled[2].out, _cfg(tmp_path / head), spec, target_name="tiny", command="x", progress=False
    )
    # bit for bit on the machine that recorded them; another CPU kind's kernels sum in another order, and six steps at
    # lr 5e-2 grow that rounding: 1e-3 still fails on any change of batches, schedule or seeding (percent-level)
    assert _losses(state) == pytest.approx(GOLDEN[head], rel=1e-3, abs=1e-5)


def test_batch_stream_skips_and_shares(distilled):
    store = distilled[3]
    stream = BatchStream(store, list(range(6)), 4, 64, 0.1, seed=3)
    taken = [next(stream) for _ in range(5)]  # 6 records, batches of 4: one per epoch
    assert all(len(b) == len(set(b)) == 4 for b in taken) and stream.position == 5
    again = BatchStream(store, list(range(6)), 4, 64, 0.1, seed=3)
    again.skip(3)
    assert again.position == 3 and [next(again), next(again)] == taken[3:]
    index = [10, 11, 12, 13, 14, 15, 16, 17]
    assert BatchStream.share(index, 0, 2, 2) == [[10, 11], [12, 13]]
    assert BatchStream.share(index, 1, 2, 2) == [[14, 15], [16, 17]]
    assert BatchStream.share(index, 0, 1, 1) == [index]
    with pytest.raises(ValueError, match="does not split into 3 process"):
        BatchStream.share(index, 0, 3, 1)
    with pytest.raises(ValueError, match="cannot fill a batch of 7"):
        BatchStream(store, list(range(6)), 7, 64, 0.1)
    b = make_batch(store, [0, 1], 64, 0.1)
    assert b.to("cpu") is b and b.to(torch.device("cpu")).input_ids is b.input_ids


def test_grad_accum_splits_the_same_batch(distilled, target, tmp_path):
    """Two micro-batches of one sequence train on the step's two sequences: the curve stays close to one
    batch of two (the mean of the halves' weighted means, not the whole batch's)."""
    torch.manual_seed(0)
    _, state = train_vanilla(
        target, distilled[2].out, _cfg(tmp_path / "acc", grad_accum=2), SPEC, command="x", progress=False
    )
    losses = _losses(state)
    assert losses[0] == pytest.approx(GOLDEN["vanilla"][0], rel=0.05) and losses != GOLDEN["vanilla"]
    assert np.mean(losses[-3:]) < np.mean(losses[:3])
    with pytest.raises(ValueError, match="multiple of 1 process"):
        train_vanilla(
            target,
            distilled[2].out,
            _cfg(tmp_path / "bad", batch_size=3, grad_accum=2),
            SPEC,
            command="x",
            progress=False,
        )


def test_interrupted_run_resumes_to_the_same_end(distilled, target, tmp_path, monkeypatch):
    out_a, out_b = tmp_path / "whole", tmp_path / "cut"
    torch.manual_seed(0)
    whole, state = train_vanilla(
        target, distilled[2].out, _cfg(out_a, checkpoint_every=2), SPEC, command="x", progress=False
    )
    assert not (out_a / "checkpoint").exists()  # removed when the run finished
    with monkeypatch.context() as m:
        m.setattr(run, "vanilla_loss", failing_at(5, run.vanilla_loss))
        torch.manual_seed(0)
        with pytest.raises(Interrupted):
            train_vanilla(target, distilled[2].out, _cfg(out_b, checkpoint_every=2), SPEC, command="x", progress=False)
    assert (out_b / "checkpoint").is_dir() and not (out_b / "checkpoint.tmp").exists()
    torch.manual_seed(1)  # another init: the checkpoint's weights win
    resumed, again = train_vanilla(
        target, distilled[2].out, _cfg(out_b, checkpoint_every=2, resume=True), SPEC, command="x", progress=False
    )
    assert _losses(again) == _losses(state) and again.best == state.best
    assert [h["step"] for h in again.history if "eval" in h] == [3, 6]
    for (name, a), (_, b) in zip(whole.state_dict().items(), resumed.state_dict().items()):
        assert torch.equal(a, b), name
    assert not (out_b / "checkpoint").exists()
    with monkeypatch.context() as m:  # cut again, resumed with another schedule
        m.setattr(run, "vanilla_loss", failing_at(3, run.vanilla_loss))
        with pytest.raises(Interrupted):
            train_vanilla(target, distilled[2].out, _cfg(out_b, checkpoint_every=2), SPEC, command="x", progress=False)
    with pytest.raises(ValueError, match=r"other settings \(checkpoint, now\): \{'steps': \(6, 8\)\}"):
        train_vanilla(
            target,
            distilled[2].out,
            _cfg(out_b, checkpoint_every=2, resume=True, steps=8),
            SPEC,
            command="x",
            progress=False,
        )
    with pytest.raises(ValueError, match="no checkpoint in"):
        train_vanilla(target, distilled[2].out, _cfg(tmp_path / "none", resume=True), SPEC, command="x", progress=False)


#: How the 2-process runs are launched: accelerate's multi-GPU launcher (gloo on this CPU), and its FSDP launcher, as
#: an accelerate config with ``distributed_type: FSDP`` and ``fsdp_version: 2`` starts it.
LAUNCHERS = {"ddp": ["--multi_gpu"], "fsdp": ["--use_fsdp", "--fsdp_version", "2"]}


def _launch(script_args: list[str], tmp_path, mode: str = "ddp") -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "OMP_NUM_THREADS": "1",
        "HF_HUB_OFFLINE": "1",
        "ACCELERATE_USE_CPU": "true",
    }
    cmd = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        *LAUNCHERS[mode],
        "--num_processes",
        "2",
        "--num_machines",
        "1",
        "--mixed_precision",
        "no",
        "--dynamo_backend",
        "no",
        str(ROOT / "tests" / "launch_train.py"),
        *script_args,
    ]
    return subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)


TWO = {"vanilla": ["--preset", "xs"], "glide": ["--target-layers", "0"], "redrafter": ["--preset", "xs"]}


@pytest.mark.parametrize("mode", list(LAUNCHERS))
def test_two_processes_interrupted_and_resumed_follow_one_process(mode, distilled, target, tmp_path):
    """``accelerate launch --multi_gpu --num_processes 2`` on the CPU (gloo), or its FSDP launch (the head, its
    gradients and AdamW states sharded over the 2 processes, hf_cascade.training.sharding): for every head, each process
    trains on its half of every batch of 2; interrupted at step 5 (after the checkpoint of step 4) and resumed, the run
    ends as the 1-process run of the same total batch in two micro-batches (the same mean of the halves'
    gradients) does; the resumed run places each process's target with ``--target-device-map auto`` (on the CPU: all
    of it there; on GPUs, its own GPUs, :func:`test_each_process_maps_its_target_over_its_own_gpus`). All heads run in
    one launch (one process start-up) each time."""
    tiny = tmp_path / "tiny"
    target.save_pretrained(tiny)
    tm.word_tokenizer().save_pretrained(tiny)

    def argv(head):
        return [
            "train",
            head,
            *TWO[head],
            "--target",
            str(tiny),
            "--data",
            str(distilled[2].out),
            "--out",
            str(tmp_path / head),
            "--draft-vocab",
            "64",
            "--steps",
            "6",
            "--batch-size",
            "2",
            "--max-len",
            "64",
            "--lr",
            "5e-2",
            "--eval-every",
            "3",
            "--eval-records",
            "2",
            "--checkpoint-every",
            "2",
            "--no-progress",
        ]

    def joined(extra):
        return [a for head in TWO for a in [":::", *argv(head), *extra]][1:]

    cut = _launch(["--fail-at-call", "5", *joined([])], tmp_path, mode)
    assert cut.returncode != 0, cut.stderr[-3000:]
    for head in TWO:
        assert f"{head}: interrupted at loss call 5" in cut.stderr, cut.stderr[-3000:]
        assert (tmp_path / head / "checkpoint" / "random_states_1.pkl").is_file()
        assert (tmp_path / head / "checkpoint" / "sharded").is_dir() == (mode == "fsdp")
    resumed = _launch(joined(["--resume", "--target-device-map", "auto"]), tmp_path, mode)  # each maps its own
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert resumed.stdout.count("saved ") == 3  # the main process reports, once a head
    specs = {
        "vanilla": dataclasses.replace(PRESETS["xs"], draft_vocab_size=64),
        "glide": dataclasses.replace(GLIDE_PRESETS["xs"], draft_vocab_size=64, target_layer_ids=(0,)),
        "redrafter": dataclasses.replace(REDRAFTER_PRESETS["xs"], draft_vocab_size=64),
    }
    for head, fn in (("vanilla", train_vanilla), ("glide", train_glide), ("redrafter", train_redrafter)):
        two = json.loads((tmp_path / head / "trainer_state.json").read_text())
        assert two["step"] == 6 and two["processes"] == 2 and not (tmp_path / head / "checkpoint").exists()
        assert two["layout"]["fsdp"] == (mode == "fsdp")
        share = two["layout"]["parameters_here"] / two["layout"]["head_parameters"]  # the main process's
        assert (0.4 < share < 0.6) if mode == "fsdp" else share == 1, share
        torch.manual_seed(0)  # the CLI's --seed 0 (warmup: its default, 30)
        _, one = fn(
            target,
            distilled[2].out,
            _cfg(tmp_path / f"one-{head}", grad_accum=2, warmup=30),
            specs[head],
            target_name=str(tiny),
            command="x",
            progress=False,
        )
        assert [h["loss"] for h in two["history"] if "loss" in h] == pytest.approx(_losses(one), rel=1e-4), head
        evals = [h["eval"]["alpha"] for h in two["history"] if "eval" in h]
        assert evals == pytest.approx([h["eval"]["alpha"] for h in one.history if "eval" in h], abs=1e-6), head


def test_distill_in_two_processes_merges_disjoint_shards(distilled, tmp_path, capfd, monkeypatch):
    """``hf-cascade distill --num-processes 2`` (the launch it starts: ``accelerate launch --multi_gpu``, gloo on
    the CPU): prompts shard over the processes; the parts merge into one store holding every prompt once; a
    part an interrupted run left behind is merged first (its prompt is not generated again)."""
    from hf_cascade.cli import main
    from hf_cascade.data import PROMPT_FORMAT, format_prompt

    tok = distilled[1]
    tiny = tmp_path / "tiny"
    tm.llama_target().save_pretrained(tiny)
    tok.save_pretrained(tiny)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"question": p.text}) + "\n" for p in PROMPTS))
    out = tmp_path / "two"
    meta = {
        "target": str(tiny),
        "prompt_format": PROMPT_FORMAT,
        "max_new_tokens": 12,
        "hidden_size": 0,
        "vocab_size": tm.VOCAB,
    }
    left = DistillStore.create_or_resume(out / "parts" / "part-7", meta)
    left.append("p:0", "p", [1, 5, 9], [6, 7], False)
    argv = [
        "distill",
        "--target",
        str(tiny),
        "--out",
        str(out),
        "--prompts",
        str(prompts),
        "--max-new-tokens",
        "12",
        "--batch-size",
        "3",
        "--no-progress",
        "--num-processes",
        "2",
    ]
    for name, value in (
        ("PYTHONPATH", str(ROOT)),
        ("OMP_NUM_THREADS", "1"),
        ("HF_HUB_OFFLINE", "1"),
        ("ACCELERATE_USE_CPU", "true"),
    ):
        monkeypatch.setenv(name, value)
    code = main(argv)
    printed = capfd.readouterr()
    assert code == 0, printed.err[-3000:]
    assert printed.out.count("sequences,") == 1 and printed.err.count("loading target") == 1  # the main process
    two = DistillStore.open(out)
    assert sorted(r.id for r in two.records) == sorted(f"p:{i}" for i in range(len(PROMPTS)))
    assert not (out / "parts").exists()
    assert two.sequence(0)[0].tolist() == [1, 5, 9, 6, 7]  # merged from the leftover part, not regenerated
    for i, r in enumerate(two.records[1:], start=1):
        seq, plen = two.sequence(i)
        text = PROMPTS[int(r.id.split(":")[1])].text
        assert seq[:plen].tolist() == tok(format_prompt(text, PROMPT_FORMAT)).input_ids and len(seq) > plen


@pytest.mark.parametrize(
    "head, flags",
    [("vanilla", ["--preset", "xs"]), ("glide", ["--target-layers", "0"]), ("redrafter", ["--preset", "xs"])],
)
def test_cli_bf16_with_the_target_on_a_device_map(head, flags, distilled, target, tmp_path, monkeypatch):
    """The CPU side of tests/cuda/test_cuda_training.py: ``--target-device-map auto`` loads the target with
    ``device_map="auto"``, ``--mixed-precision bf16|fp16`` autocasts
    the steps (the loss differs from float32's, a little), ``--grad-accum`` splits the batch."""
    import hf_cascade.bench.loading as loading
    from hf_cascade.cli import main

    tiny = tmp_path / "tiny"
    target.save_pretrained(tiny)
    tm.word_tokenizer().save_pretrained(tiny)
    placed = {}
    real = loading.load_model

    def load(spec, **kw):
        model, tok = real(spec, **kw)
        placed.update(kw)
        return model, tok

    monkeypatch.setattr(loading, "load_model", load)
    curves = {}
    for precision in ("bf16", "fp16", "no"):
        out = tmp_path / precision
        argv = [
            "train",
            head,
            *flags,
            "--target",
            str(tiny),
            "--data",
            str(distilled[2].out),
            "--out",
            str(out),
            "--steps",
            "4",
            "--batch-size",
            "4",
            "--grad-accum",
            "2",
            "--max-len",
            "48",
            "--eval-every",
            "4",
            "--eval-records",
            "2",
            "--draft-vocab",
            "64",
            "--mixed-precision",
            precision,
            "--no-progress",
            "--target-device-map",
            "auto",
        ]
        assert main(argv) == 0
        assert placed["device_map"] == "auto"  # (on a CPU-only machine: all of it on the CPU)
        state = json.loads((out / "trainer_state.json").read_text())
        curves[precision] = [h["loss"] for h in state["history"] if "loss" in h]
        assert state["config"]["mixed_precision"] == precision and state["config"]["grad_accum"] == 2
    for half in ("bf16", "fp16"):  # fp16: with the gradient scaler
        assert curves[half] != curves["no"] and curves[half] == pytest.approx(curves["no"], rel=0.05), half


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--grad-accum", "3"], "must be a multiple of 1 process(es) x --grad-accum 3"),
        (["--grad-accum", "0"], "gradient accumulation must be >= 1"),
        (["--target-device-map", "everywhere"], "--target-device-map must be one of auto"),
        (["--num-processes", "0"], "--num-processes must be >= 1"),
        (["--resume"], "--resume: no checkpoint in"),
        (
            ["--num-processes", "3"],
            "--batch-size 4 (sequences per step, all processes together) must be a multiple of 3",
        ),
        (["--num-processes", "2", "--target-device-map", '{"": "cpu"}'], "a JSON --target-device-map puts every"),
        (["--fsdp", "--fake-env", "FSDP_SHARDING_STRATEGY=HYBRID_SHARD_ZERO2"], "sharding strategy HYBRID_SHARD_ZERO2"),
    ],
)
def test_cli_rejects_bad_process_options_before_loading_the_target(
    flags, message, distilled, tmp_path, capsys, monkeypatch
):
    import hf_cascade.bench.loading as loading
    from hf_cascade.cli import main

    monkeypatch.setattr(loading, "load_model", lambda *a, **k: pytest.fail("the target was loaded"))
    if "--fake-env" in flags:  # as accelerate's launcher exports a config's FSDP
        name, value = flags[-1].split("=")
        monkeypatch.setenv(name, value)
        flags = flags[:-2]
    argv = [
        "train",
        "vanilla",
        "--data",
        str(distilled[2].out),
        "--out",
        str(tmp_path / "o"),
        "--batch-size",
        "4",
        *flags,
    ]
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_a_mapped_target_stays_and_the_head_goes_to_its_output_device(target, monkeypatch):
    """A target placed by a ``device_map`` (here: its parameters on the ``meta`` device, as if on another GPU)
    is not moved; in one process the head trains where the target's output layer is. Unmapped, or in one of
    several processes (DDP runs the head on the process's device): this process's device."""
    from types import SimpleNamespace

    import hf_cascade.training.accel as accel
    from hf_cascade.training.accel import head_device, place_target

    assert place_target(target) is target and head_device(target) == torch.device("cpu")
    mapped = copy.deepcopy(target).to("meta")
    mapped.hf_device_map = {"": "meta"}
    place_target(mapped)
    assert {p.device.type for p in mapped.parameters()} == {"meta"} and head_device(mapped).type == "meta"
    assert not any(p.requires_grad for p in mapped.parameters())
    monkeypatch.setattr(accel, "process_state", lambda: SimpleNamespace(num_processes=2, device=torch.device("cpu")))
    assert head_device(mapped) == torch.device("cpu")


def test_each_process_maps_its_target_over_its_own_gpus(monkeypatch):
    """With several processes a named map shards each process's target over every ``local``-th GPU from its own
    (the first is the device accelerate gives it), within the memory accelerate finds there and its share of the
    CPU's; one process, an explicit map or no GPU: the map alone (golden values)."""
    from types import SimpleNamespace

    import hf_cascade.training.accel as accel
    from hf_cascade.training.accel import process_gpus, target_max_memory

    assert process_gpus(0, 2, 8) == [0, 2, 4, 6] and process_gpus(1, 2, 8) == [1, 3, 5, 7]
    assert process_gpus(2, 3, 7) == [2, 5] and process_gpus(0, 1, 3) == [0, 1, 2]
    with pytest.raises(ValueError, match="needs a GPU per process at least; 1 found"):
        process_gpus(1, 2, 1)
    free = {0: 80, 1: 81, 2: 82, 3: 83, "cpu": 1000}
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setattr(accel, "process_state", lambda: SimpleNamespace(num_processes=2, local_process_index=1))
    assert target_max_memory("auto", free) == {1: 81, 3: 83, "cpu": 500}
    assert target_max_memory({"": 0}, free) is None and target_max_memory(None, free) is None
    assert target_max_memory("auto", {"cpu": 1000}) is None  # no GPU: the map alone
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")  # 8 processes on 2 machines of 4 GPUs
    monkeypatch.setattr(accel, "process_state", lambda: SimpleNamespace(num_processes=8, local_process_index=3))
    assert target_max_memory("balanced", free) == {3: 83, "cpu": 250}
    monkeypatch.setattr(accel, "process_state", lambda: SimpleNamespace(num_processes=1, local_process_index=0))
    assert target_max_memory("auto", free) is None  # one process: all GPUs


def test_process_options_and_device_maps():
    import argparse

    from hf_cascade.training.launch import _without_num_processes, check_processes, device_map

    args = argparse.Namespace(num_processes=1, target_device_map="auto")
    check_processes(args, 1)
    check_processes(args, 2)  # each process maps its own copy
    args.target_device_map = '{"": "cpu"}'
    check_processes(args, 1)
    with pytest.raises(ValueError, match="a JSON --target-device-map puts every process's target on the same"):
        check_processes(args, 2)
    assert device_map('{"": "cpu"}') == {"": "cpu"} and device_map(None) is None
    assert _without_num_processes(["train", "--num-processes", "2", "--steps", "3", "--num-processes=4"]) == [
        "train",
        "--steps",
        "3",
    ]
