"""The static-cache contract as functions of a target, on any device: tests/cuda/test_cuda_static.py runs them on a
GPU, tests/test_static_contract.py on the CPU (tests/test_static.py holds the CPU contract of the static path itself).

* **settings** (:func:`static_settings`): the ``generate`` keyword arguments of a mode, given alike to plain
  ``generate`` (the reference) and to the assisted call. ``"eager"``: ``cache_implementation="static"`` and
  ``disable_compile=True`` (on an accelerator transformers compiles every static-cache call unless told not to).
  ``"compiled"``: ``cache_implementation="static"`` and :func:`compile_config` -- ``CompileConfig()`` on an
  accelerator (inductor; on CUDA its default mode ``reduce-overhead`` takes CUDA graphs), and on a CPU
  ``_compile_all_devices`` with the ``aot_eager`` backend (the same dynamo graphs, no code generation). Both with
  one ``max_cache_len`` (:data:`CACHE_LEN`, above every case's length), as a compiled deployment sets it: one
  cache shape for every call.
* **parity** (:func:`check_static_parity`): every case of tests/test_contract.py's :func:`greedy_cases` with the
  mode's settings (:func:`static_cases`). In float32 the output is plain ``generate``'s token for token; in a half
  dtype the first divergence is judged by :func:`hf_cascade.parity.divergence` (:func:`judge`): a tie passes and is
  returned (with its logit gap) for the report, a larger gap fails.
* **graphs** (:func:`check_second_pass`): compiled, verification runs the core's compiled decoder, a second pass
  over the cases captures no new dynamo graph (``counters["stats"]["unique_graphs"]``), and no frame reaches
  dynamo's recompile limit (which would silently run it eagerly: :func:`strict_recompiles` makes that an error).
  Dynamo keeps its graphs per code object, and transformers' forward wrappers are one code object for every model:
  graphs of other targets in the same process count against the limit too. :func:`check_every_strategy` is a
  user's process: one target, every strategy one after another, then again, within dynamo's default limit.
* **batches** (:func:`static_batch_cases`, :func:`check_static_batch_parity`): left-padded batches of two and three
  ragged prompts (rows finishing at different steps, an EOS inside a draft, ``max_new_tokens`` inside drafts, a
  repetition penalty) with the mode's settings, against plain batched ``generate`` with the same settings, each row
  judged as above (its padding stripped); :func:`check_second_pass` with ``parity=check_static_batch_parity``
  compiles nothing on its second pass.
"""

from __future__ import annotations

import warnings

import torch

from hf_cascade.parity import Divergence, divergence
from hf_cascade.placement import target_device_dtype
from tests.test_contract import ASCENDING, REPETITIVE, _eos_inside_drafts, greedy_cases

MODES = ("eager", "compiled")
#: the ``max_cache_len`` of the settings: more than every case of :func:`greedy_cases` needs (at most 49 columns)
CACHE_LEN = 64


def compile_config(device: torch.device | str):
    """``CompileConfig()`` (transformers' defaults) on an accelerator; on a CPU, ``aot_eager`` without a mode and
    ``_compile_all_devices`` (transformers compiles on a CPU only when told to)."""
    from transformers import CompileConfig

    if torch.device(device).type != "cpu":
        return CompileConfig()
    config = CompileConfig(backend="aot_eager", mode=None)
    config._compile_all_devices = True
    return config


def static_settings(mode: str, device: torch.device | str, max_cache_len: int | None = CACHE_LEN) -> dict:
    """The ``generate`` keyword arguments of ``mode`` (``"eager"`` or ``"compiled"``) for a target on ``device``
    (``max_cache_len=None``: each call's cache sized by its own length)."""
    sized = {} if max_cache_len is None else {"max_cache_len": max_cache_len}
    if mode == "eager":
        return {"cache_implementation": "static", "disable_compile": True, **sized}
    if mode == "compiled":
        return {"cache_implementation": "static", "compile_config": compile_config(device), **sized}
    raise ValueError(f"unknown mode {mode!r}; known: {MODES}")


def target_settings(mode: str, target, max_cache_len: int | None = CACHE_LEN) -> dict:
    """:func:`static_settings` for ``target``'s device (its input embeddings', or accelerate's execution device)."""
    return static_settings(mode, target_device_dtype(target)[0], max_cache_len)


def static_cases(target, settings: dict) -> list[tuple[str, torch.Tensor, dict, list]]:
    """``(case, prompt, generate kwargs, plain output)``: :func:`greedy_cases`'s prompts and keyword arguments with
    ``settings`` added, and plain ``generate``'s output with them (the same cache and compile settings)."""
    out = []
    for case, prompt, kw, _ in greedy_cases(target):
        kw = {**kw, **settings}
        out.append((case, prompt, kw, target.generate(prompt, do_sample=False, **kw).tolist()))
    return out


def describe(d: Divergence, label: str) -> str:
    return (
        f"{label}: first divergence at position {d.position} (plain {d.expected}, assisted {d.got}); top-1 - top-2 "
        f"logit {d.gap:.4g}, top-1 - assisted token's {d.got_gap:.4g}, tie tolerance {d.tolerance:.3g}"
    )


def judge(model, expected: list[int], got: list[int], exact: bool, label: str) -> str | None:
    """``None`` when ``got`` is ``expected``; else, unless ``exact`` (float32: any difference fails), the report of a
    tie (:func:`hf_cascade.parity.divergence`); a divergence that is not a tie fails with its logit gap."""
    if got == expected:
        return None
    d = divergence(model, expected, got)
    report = describe(d, label)
    assert not exact, f"float32 outputs must be identical; {report}"
    assert d.tie, f"not a tie; {report}"
    return report


def rows_of(cases) -> int:
    """The rows the cases decode (a case's plain output is ``[rows, length]``)."""
    return sum(len(expected) for *_, expected in cases)


def assert_ties_rare(ties: list[str], runs: int) -> None:
    """In bf16 a near-tie may flip between verification's kernels and plain decoding's (each divergence was judged a
    tie by :func:`judge`, with its logit gap), but a tie is a coincidence of one position: at most a quarter of
    ``runs`` rows decoded may end in one. More is a systematic difference that happens to stay within rounding at its
    first position. The ties' reports (their logit gaps) are shown as a warning."""
    if ties:
        warnings.warn("bf16 ties (each judged, with its logit gap):\n" + "\n".join(ties), stacklevel=2)
    assert len(ties) <= runs // 4, f"{len(ties)} of {runs} runs diverged:\n" + "\n".join(ties)


def check_static_parity(target, assistant, cases, exact: bool) -> list[str]:
    """Every case (:func:`static_cases`) with ``assistant`` gives plain ``generate``'s output (``exact``) or differs
    from it by a tie (:func:`judge`); the statistics count the new tokens, and drafts were accepted. Returns the ties'
    reports."""
    accepted, ties = 0, []
    for case, prompt, kw, expected in cases:
        got = target.generate(prompt, do_sample=False, assistant_model=assistant, **kw)
        stats = assistant.last_stats
        assert stats.new_tokens == got.shape[1] - prompt.shape[1], case
        accepted += sum(stats.accepted_per_call)
        report = judge(target, expected[0], got[0].tolist(), exact, case)
        if report is not None:
            ties.append(report)
    assert accepted > 0  # drafts were accepted
    return ties


def unique_graphs() -> int:
    """Dynamo graphs captured so far in this process."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def default_recompile_limit() -> int:
    """Dynamo's default ``recompile_limit`` (what a user's process has)."""
    from torch._dynamo import config

    entry = getattr(config, "_config", {}).get("recompile_limit")
    return int(getattr(entry, "default", 8))


def strict_recompiles(**patch):
    """A context in which reaching dynamo's recompile limit raises (by default the frame then runs eagerly, which
    would let a compiled test pass without compiling); ``patch``: more of dynamo's settings."""
    from torch._dynamo import config

    return config.patch(fail_on_recompile_limit_hit=True, **patch)


def check_second_pass(target, assistant, cases, exact: bool, parity=check_static_parity) -> list[str]:
    """Compiled: a first pass over ``cases`` (warm-up: it compiles every query bucket they reach) and a second one,
    both with ``parity`` (:func:`check_static_parity`, or :func:`check_static_batch_parity` for batches);
    verification ran the core's compiled decoder, and the second pass captured no new dynamo graph. Returns the ties'
    reports (both passes)."""
    from hf_cascade.core import compiled

    with strict_recompiles():
        ties = parity(target, assistant, cases, exact)
        assert target.get_decoder() in compiled._COMPILED, "verification did not run the compiled decoder"
        before = unique_graphs()
        ties += parity(target, assistant, cases, exact)
    assert unique_graphs() == before, f"{unique_graphs() - before} new dynamo graph(s) on the second pass"
    assert_ties_rare(ties, runs=2 * rows_of(cases))
    return ties


def check_every_strategy(target, make_assistants: dict, settings: dict, exact: bool) -> list[str]:
    """A user's process, compiled (``settings``): dynamo reset, plain ``generate`` over the cases (the references,
    :func:`static_cases`), every assistant of ``make_assistants`` (name -> factory) one after another, then all of
    them again: within dynamo's default recompile limit, and the second round captures no new graph; ties are rare
    (:func:`assert_ties_rare`). Returns the ties' reports."""
    import torch._dynamo

    torch._dynamo.reset()
    ties = []
    with strict_recompiles(recompile_limit=default_recompile_limit()):
        cases = static_cases(target, settings)
        assistants = {name: make() for name, make in make_assistants.items()}
        for name, assistant in assistants.items():
            ties += [f"{name}, {t}" for t in check_static_parity(target, assistant, cases, exact)]
        before = unique_graphs()
        for name, assistant in assistants.items():
            ties += [f"{name}, {t}" for t in check_static_parity(target, assistant, cases, exact)]
    assert unique_graphs() == before, f"{unique_graphs() - before} new dynamo graph(s) in the second round"
    assert_ties_rare(ties, runs=2 * len(assistants) * rows_of(cases))
    return ties


# -- batches ------------------------------------------------------------------------------------------------

#: the padding token of the batches (the tiny targets' ``PAD``), given to plain and assisted ``generate`` alike
PAD = 0
REP = REPETITIVE[0].tolist()  # drafts get accepted
THREE = [REP, [1, 40], ASCENDING[0].tolist()[:8]]  # 9, 2 and 8 tokens
TWO = [[9], REP]  # 1 and 9 tokens


def left_padded(rows: list[list[int]], device) -> tuple[torch.Tensor, torch.Tensor]:
    """``(input_ids, attention_mask)`` of ``rows`` left-padded with :data:`PAD`, on ``device``."""
    width = max(map(len, rows))
    input_ids = torch.tensor([[PAD] * (width - len(r)) + r for r in rows], device=device)
    return input_ids, torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows], device=device)


def static_batch_cases(target, settings: dict) -> list[tuple[str, tuple, dict, list]]:
    """``(case, (input_ids, attention_mask), generate kwargs, plain batched output)``: batches of two and three ragged
    prompts with ``settings`` added, and plain batched ``generate``'s output with them."""
    device = target_device_dtype(target)[0]
    eos = _eos_inside_drafts(target)
    three, two = left_padded(THREE, device), left_padded(TWO, device)
    cases = [
        ("three_rows", three, {"max_new_tokens": 20}),
        ("three_rows_eos_in_draft", three, {"max_new_tokens": 24, "eos_token_id": eos}),  # rows finish apart
        ("two_rows_max_new_tokens_5", two, {"max_new_tokens": 5}),
        ("two_rows_repetition_penalty", two, {"max_new_tokens": 12, "repetition_penalty": 1.5}),
    ]
    out = []
    for case, (input_ids, mask), kw in cases:
        kw = {**kw, "pad_token_id": PAD, **settings}
        plain = target.generate(input_ids, attention_mask=mask, do_sample=False, **kw).tolist()
        out.append((case, (input_ids, mask), kw, plain))
    return out


def check_static_batch_parity(target, assistant, cases, exact: bool) -> list[str]:
    """Every batch case (:func:`static_batch_cases`) with ``assistant`` gives plain batched ``generate``'s rows
    (``exact``) or rows that differ by a tie (:func:`judge`, on the row without its padding); one row's statistics per
    row, and drafts were accepted. Returns the ties' reports."""
    accepted, ties = 0, []
    for case, (input_ids, mask), kw, expected in cases:
        got = target.generate(input_ids, attention_mask=mask, do_sample=False, assistant_model=assistant, **kw)
        stats = assistant.last_stats
        assert len(stats.rows) == input_ids.shape[0], case
        accepted += sum(sum(r.accepted_per_call) for r in stats.rows)
        for b, pad in enumerate((mask == 0).sum(1).tolist()):
            report = judge(target, expected[b][pad:], got[b].tolist()[pad:], exact, f"{case}, row {b}")
            if report is not None:
                ties.append(report)
    assert accepted > 0  # drafts were accepted
    return ties


__all__ = [
    "CACHE_LEN",
    "MODES",
    "PAD",
    "check_every_strategy",
    "check_second_pass",
    "check_static_batch_parity",
    "check_static_parity",
    "compile_config",
    "default_recompile_limit",
    "describe",
    "judge",
    "left_padded",
    "static_batch_cases",
    "static_cases",
    "static_settings",
    "strict_recompiles",
    "target_settings",
    "unique_graphs",
]
