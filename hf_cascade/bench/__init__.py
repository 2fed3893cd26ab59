"""Benchmark harness of ``hf-cascade bench``: interleaved, same-run comparisons against plain ``generate``.

    from hf_cascade.bench import BenchConfig, run_benchmark, write_results, markdown_report
    result = run_benchmark(BenchConfig(strategy="maxgram", baselines=["plain", "pld"]), model, tok, prompts)
    result = run_benchmark(BenchConfig(strategy="maxgram,glide", baselines=["plain", "plain-kernels"]), model, tok,
                           prompts, strategy_drafts={"glide": [glide_head]})   # several strategies, one rotation
    write_results(result, "out/")   # results.json, report.md, PNGs
    config = BenchConfig(strategy="maxgram", baselines=["plain", "plain-kernels"], batch_sizes=[1, 2, 4, 8])
    result = run_benchmark(config, model, tok, prompts)   # then result.batched: the same methods on batches of prompts

Modules: :mod:`.config` (settings), :mod:`.methods` (what is compared), :mod:`.calls` (one timed call of a
method), :mod:`.runner` (the timed loop), :mod:`.summary` (aggregation), :mod:`.report` and :mod:`.plots` (outputs),
:mod:`.loading` (models, shipped heads and prompts for the CLI), :mod:`.command` (``hf-cascade bench``), :mod:`.swi`
(standardized walltime improvement), with :mod:`.costs` (its cost tables) and :mod:`.counting` (the forwards of
baselines without statistics), and :mod:`.batched` (the batched sweep of ``--batch-size``: throughput on left-padded
batches).
:mod:`.overhead` is ``hf-cascade bench --overhead`` (host time and device reads per target call on the tiny target of
:mod:`.tiny`, where the forward is nearly free: the GPU regime).
"""

from .config import (
    BASELINES,
    STRATEGIES,
    BenchConfig,
    parse_baselines,
    parse_cost_models,
    parse_drafts,
    parse_k_matrix,
    parse_strategies,
)
from .methods import MethodUnavailable
from .report import markdown_report, write_results
from .runner import BenchResult, run_benchmark

__all__ = [
    "BASELINES",
    "STRATEGIES",
    "BenchConfig",
    "BenchResult",
    "MethodUnavailable",
    "markdown_report",
    "parse_baselines",
    "parse_cost_models",
    "parse_drafts",
    "parse_k_matrix",
    "parse_strategies",
    "run_benchmark",
    "write_results",
]
