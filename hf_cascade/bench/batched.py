"""The batched sweep of ``hf-cascade bench --batch-size 1,2,4,8``: every method's throughput on left-padded
batches of prompts, against plain batched ``generate`` in the same run (:func:`run_batched`, data only).

Rules:

* **batches** -- for each batch size ``B`` the run's prompts (those of the single-prompt runs, in their
  order) are cut into consecutive batches of ``B``; the last one holds the remainder and may be shorter.
  Each prompt is encoded as for one prompt (:func:`~hf_cascade.bench.calls.encode`) and the batch is
  left-padded to its longest prompt with the tokenizer's pad token, else its EOS token: the ids and
  ``attention_mask`` of ``tokenizer(texts, padding=True)`` with ``tokenizer.padding_side = "left"``.
* **methods** -- the methods of the single-prompt runs that ran, on the same batches, interleaved per
  batch: batch ``j`` runs every method once in the base order rotated by ``j``, after one untimed warm-up
  ``generate`` per method and batch size on the first batch. ``plain`` and ``plain-kernels`` are plain
  batched ``generate`` (the latter inside the CPU kernels, as for one prompt); the strategies and the
  baselines that run in hf_cascade's decoding core take the batch through ``generate(...,
  assistant_model=...)``. The baselines of :data:`UNBATCHED` cannot run a batch: they are skipped for
  ``B > 1`` (and noted); at ``B = 1`` (one unpadded prompt) they run.
* **tokens** -- a row's tokens are those after the padded prompt up to where it stopped: through its first
  EOS token (included), else all of them; the pads that plain ``generate`` (and the core) append after a
  row stopped are not counted. A method's throughput: those tokens, summed over the batch, per second.
* **speedup** -- against ``plain`` and against ``plain-kernels``: ``throughput_ratio``, the method's tokens
  per second over the reference's (totals over the batches where both ran), and the paired ratios of
  :func:`~hf_cascade.bench.summary.paired` over batches on seconds per token (``geomean`` with its 95%
  bootstrap interval: every batch weighs the same). Greedy, every method emits plain's tokens: these are
  time ratios.
* **equality** -- greedy: each row is compared with plain's row; ``identical_rows`` counts the equal ones and
  every differing row is listed in ``mismatches`` (the report prints them in bold). Sampling: ``None``.
* **target calls** -- ``tokens_per_target_call``: from the method's statistics (batched:
  :class:`~hf_cascade.core.stats.BatchStats`, the batch's tokens per batched verification forward); plain
  decoding runs one forward per token of its longest row, so its value is the batch's tokens over those.

No standardized walltime improvement here (its costs are those of single-prompt forwards).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ..placement import accelerators, target_device_dtype
from .calls import encode, generation_kwargs, rotated, timed
from .config import BenchConfig
from .methods import Method
from .summary import KERNELS, paired

_ASSISTED = "transformers' assisted generation runs batch size 1 only"
#: Baselines that cannot run a batch, and why: skipped for ``B > 1``.
UNBATCHED = {
    "pld": "transformers' prompt lookup runs batch size 1 only",
    "pld-tuned": "transformers' prompt lookup runs batch size 1 only",
    "hf-assisted": _ASSISTED,
    "hf-assisted-constant": _ASSISTED,
    "hf-assisted-confidence": _ASSISTED,
    "maxgram-hf-loop": "transformers' assisted loop runs one unpadded row only",
    "economize": "economize's decoding is measured one prompt at a time",
}


def skipped(methods: Sequence[str], size: int) -> dict[str, str]:
    """The methods of ``methods`` skipped at batch size ``size`` (:data:`UNBATCHED`; none at ``size`` 1), with why."""
    return {} if size <= 1 else {m: UNBATCHED[m] for m in methods if m in UNBATCHED}


@dataclass
class Batch:
    """Batch ``index`` of one batch size: the prompts ``prompt_indices``, left-padded."""

    index: int
    prompt_indices: list[int]
    input_ids: torch.Tensor
    attention_mask: torch.Tensor

    @property
    def width(self) -> int:
        return int(self.input_ids.shape[1])


def pad_token_id(tokenizer: Any) -> int:
    """The tokenizer's pad token, else its EOS token (``ValueError`` with neither)."""
    pad = getattr(tokenizer, "pad_token_id", None)
    if pad is None:
        pad = getattr(tokenizer, "eos_token_id", None)
    if pad is None:
        raise ValueError("batches need a pad token: the tokenizer has neither a pad nor an EOS token")
    return int(pad)


def make_batches(
    tokenizer: Any, prompts: Sequence[dict], size: int, device: torch.device | str | None = None
) -> list[Batch]:
    """``prompts`` in consecutive batches of ``size`` (the last may be shorter), each left-padded (module docstring),
    on ``device`` (``None``: the CPU)."""
    pad = pad_token_id(tokenizer)
    batches = []
    for j, start in enumerate(range(0, len(prompts), size)):
        rows = [encode(tokenizer, p, device)[0][0] for p in prompts[start : start + size]]
        width = max(len(r) for r in rows)
        ids = torch.full((len(rows), width), pad, dtype=torch.long, device=device)
        mask = torch.zeros((len(rows), width), dtype=torch.long, device=device)
        for b, row in enumerate(rows):
            ids[b, width - len(row) :] = row
            mask[b, width - len(row) :] = 1
        batches.append(Batch(j, list(range(start, start + len(rows))), ids, mask))
    return batches


def eos_token_ids(model: Any, tokenizer: Any) -> set[int]:
    """The tokens that stop a row: the model's ``generation_config.eos_token_id`` (one or several), else the
    tokenizer's EOS token."""
    eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if eos is None:
        eos = getattr(tokenizer, "eos_token_id", None)
    return set() if eos is None else {int(e) for e in torch.as_tensor(eos).flatten().tolist()}


def stopped_rows(sequences: torch.Tensor, width: int, eos: set[int]) -> list[list[int]]:
    """Each row's tokens after the padded prompt's ``width`` columns, through its first EOS token (included),
    else all of them (the pads after a row stopped are not its tokens)."""
    out = []
    for row in sequences[:, width:].tolist():
        stop = next((i for i, t in enumerate(row) if t in eos), None)
        out.append(row if stop is None else row[: stop + 1])
    return out


def run_batched(
    config: BenchConfig,
    model: Any,
    tokenizer: Any,
    prompts: Sequence[dict],
    methods: Mapping[str, Method],
    progress: bool = False,
) -> dict:
    """The batched sweep over ``config.batch_sizes`` with the built (and warmed-up) ``methods`` of a run, ``plain``
    among them (module docstring). Returns ``{"batch_sizes", "pad_token_id", "eos_token_ids", "sizes": [per batch
    size: batch_size, batches, skipped {method: why}, methods {method: numbers}], "mismatches", "errors",
    "records"}``: one record per (batch size, batch, method), numbers as :func:`summarize_batched`."""
    kwargs = generation_kwargs(config, tokenizer)
    warm = generation_kwargs(config, tokenizer, max_new_tokens=config.warmup_tokens)
    eos = eos_token_ids(model, tokenizer)
    device, devices = target_device_dtype(model)[0], accelerators(model)  # inputs' device; clocks wait for these
    plan = [(size, make_batches(tokenizer, prompts, size, device)) for size in config.batch_sizes]
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=sum(len(b) for _, b in plan), desc="bench batched", unit="batch")
    records: list[dict] = []
    errors: dict[str, str] = {}
    sizes = []
    for size, batches in plan:
        skip = skipped(list(methods), size)
        active = {n: m for n, m in methods.items() if n not in skip}
        _warm_up(active, batches[0], warm, config.seed, errors, size, devices)
        for batch in batches:
            records += _run_batch(active, batch, size, kwargs, config, eos, errors, devices)
            if bar is not None:
                bar.update(1)
        sizes.append({"batch_size": size, "batches": len(batches), "skipped": skip})
    if bar is not None:
        bar.close()
    summary = summarize_batched(records, list(methods))
    for entry in sizes:
        entry["methods"] = summary.get(entry["batch_size"], {})
    mismatches = [
        {
            "batch_size": r["batch_size"],
            "method": r["method"],
            "batch_index": r["batch_index"],
            "prompt_indices": r["mismatched_prompts"],
        }
        for r in records
        if r["mismatched_prompts"]
    ]
    return {
        "batch_sizes": list(config.batch_sizes),
        "pad_token_id": pad_token_id(tokenizer),
        "eos_token_ids": sorted(eos),
        "sizes": sizes,
        "mismatches": mismatches,
        "errors": errors,
        "records": records,
    }


def _warm_up(
    active: dict[str, Method],
    batch: Batch,
    warm: dict,
    seed: int,
    errors: dict,
    size: int,
    devices: Sequence[torch.device] = (),
) -> None:
    """One untimed ``generate`` per method on ``batch``; a method that fails it leaves this batch size."""
    for name in list(active):
        try:
            timed(active[name], batch.input_ids, batch.attention_mask, warm, seed, devices)
        except Exception as exc:  # a baseline that breaks must not stop the others
            if name == "plain":
                raise
            errors[f"{name} (batch size {size})"] = f"{type(exc).__name__} in the warm-up: {exc}"
            del active[name]
            continue
        active[name].after_warmup()


def _run_batch(
    active: dict[str, Method],
    batch: Batch,
    size: int,
    kwargs: dict,
    config: BenchConfig,
    eos: set[int],
    errors: dict,
    devices: Sequence[torch.device] = (),
) -> list[dict]:
    """Every active method once on ``batch`` (rotated order); its records, rows compared with plain's."""
    rows: dict[str, list[list[int]]] = {}
    records = []
    for order, name in enumerate(rotated(list(active), batch.index)):
        method = active[name]
        try:
            out, stats, seconds = timed(
                method, batch.input_ids, batch.attention_mask, kwargs, config.seed + batch.index, devices
            )
        except Exception as exc:
            if name == "plain":
                raise
            errors[f"{name} (batch size {size})"] = f"{type(exc).__name__} on batch {batch.index}: {exc}"
            del active[name]
            continue
        rows[name] = stopped_rows(getattr(out, "sequences", out), batch.width, eos)
        counts = [len(r) for r in rows[name]]
        tokens = sum(counts)
        if stats and stats.get("target_calls"):
            calls, verified = stats["target_calls"], stats.get("new_tokens", tokens)
        elif method.one_forward_per_token:
            calls, verified = max(counts), tokens  # one forward per token of the longest row
        else:
            calls, verified = None, None
        records.append(
            {
                "batch_size": size,
                "batch_index": batch.index,
                "prompt_indices": list(batch.prompt_indices),
                "method": name,
                "order": order,
                "rows": len(counts),
                "prompt_width": batch.width,
                "row_tokens": counts,
                "new_tokens": tokens,
                "seconds": seconds,
                "tokens_per_second": tokens / seconds if seconds > 0 else 0.0,
                "target_calls": calls,
                "verified_tokens": verified,
                "stats": {
                    k: stats[k]
                    for k in ("target_calls", "prefill_calls", "new_tokens", "tokens_per_target_call", "compactions")
                    if k in stats
                }
                if stats
                else None,
            }
        )
    plain = rows.get("plain")
    for rec in records:
        if config.sampling or plain is None:  # sampled rows differ by design
            rec["identical_rows"], rec["mismatched_prompts"] = None, []
            continue
        differ = [p for p, mine, ref in zip(batch.prompt_indices, rows[rec["method"]], plain) if mine != ref]
        rec["identical_rows"], rec["mismatched_prompts"] = rec["rows"] - len(differ), differ
    return records


def summarize_batched(records: list[dict], methods: Sequence[str]) -> dict[int, dict[str, dict]]:
    """``{batch size: {method: numbers}}`` in ``methods`` order: ``batches``, ``rows``, ``new_tokens``, ``seconds``,
    ``tokens_per_second``, ``vs_plain`` / ``vs_plain_kernels`` (:func:`versus`; ``None`` for the reference
    itself or when it did not run), ``tokens_per_target_call`` (``None``: unknown) and ``identical_rows``
    (``None`` when sampling)."""
    out: dict[int, dict[str, dict]] = {}
    for size in dict.fromkeys(r["batch_size"] for r in records):
        group = [r for r in records if r["batch_size"] == size]
        out[size] = {}
        for m in methods:
            mine = [r for r in group if r["method"] == m]
            if not mine:
                continue
            tokens, seconds = sum(r["new_tokens"] for r in mine), sum(r["seconds"] for r in mine)
            counted = [r for r in mine if r["target_calls"]]
            same = [r["identical_rows"] for r in mine]
            out[size][m] = {
                "batches": len(mine),
                "rows": sum(r["rows"] for r in mine),
                "new_tokens": tokens,
                "seconds": seconds,
                "tokens_per_second": tokens / seconds if seconds > 0 else 0.0,
                "vs_plain": versus(group, m, "plain"),
                "vs_plain_kernels": versus(group, m, KERNELS),
                "tokens_per_target_call": (
                    sum(r["verified_tokens"] for r in counted) / sum(r["target_calls"] for r in counted)
                    if counted
                    else None
                ),
                "identical_rows": None if any(s is None for s in same) else sum(same),
            }
    return out


def versus(records: list[dict], method: str, reference: str) -> dict | None:
    """``method``'s speed relative to ``reference`` over the batches (of one batch size) where both ran:
    ``throughput_ratio`` (its tokens per second over the reference's, totals) and :func:`paired`'s numbers on
    seconds per token (above 1: ``method`` is faster), ``batches`` in place of ``prompts``. ``None`` when
    ``method`` is ``reference`` or they share no batch."""
    if method == reference:
        return None
    by_batch: dict[int, dict[str, dict]] = defaultdict(dict)
    for r in records:
        by_batch[r["batch_index"]][r["method"]] = r
    both = [(t[reference], t[method]) for t in by_batch.values() if reference in t and method in t]
    runs = [
        {"prompt_index": j, "method": name, "seconds": rec["seconds"], "new_tokens": rec["new_tokens"]}
        for j, pair in enumerate(both)
        for name, rec in zip((reference, method), pair)
    ]
    result = paired(runs, reference, method)
    if result is None:
        return None
    result["throughput_ratio"] = _rate([m for _, m in both]) / _rate([ref for ref, _ in both])
    result["batches"] = result.pop("prompts")
    return result


def _rate(records: list[dict]) -> float:
    """Tokens per second over ``records``."""
    return sum(r["new_tokens"] for r in records) / sum(r["seconds"] for r in records)


__all__ = [
    "UNBATCHED",
    "Batch",
    "eos_token_ids",
    "make_batches",
    "pad_token_id",
    "run_batched",
    "skipped",
    "stopped_rows",
    "summarize_batched",
    "versus",
]
