"""Standardized walltime improvement (SWI) in the bench: golden numbers of the pure functions of
:mod:`hf_cascade.bench.swi`, the forwards every strategy counts (checked against forward hooks on the models),
the counts of the baselines without statistics, the ``--cost-model`` flag, and a tiny end-to-end bench.
Tiny models, tokenizer and prompts come from ``tests/test_bench.py``."""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch

import hf_cascade  # noqa: F401  (installs the generate hook)
from hf_cascade import (
    CascadeAssistant,
    CascadeSettings,
    DynamicWindowAssistant,
    DynamicWindowSettings,
    GlideSettings,
    MaxGram,
    ReDrafterSettings,
)
from hf_cascade.bench import BenchConfig, markdown_report, parse_cost_models, run_benchmark, write_results
from hf_cascade.bench.build import build_method
from hf_cascade.bench.costs import build_costs, parameter_count, params_cost
from hf_cascade.bench.counting import assistant_levels
from hf_cascade.bench.peers import ECONOMIZE_RUNS_HERE
from hf_cascade.bench.swi import (
    STATISTICAL,
    Costs,
    DrafterCost,
    flat_target,
    group_swi,
    plain_time,
    record_times,
    standardized_time,
    swi,
)
from hf_cascade.cli import bench_config, build_parser
from hf_cascade.core.payoff import VerifyCost
from hf_cascade.glide import GlideAssistant
from hf_cascade.redrafter import ReDrafterAssistant
from tests.redrafter_helpers import random_head
from tests.test_bench import NEW_TOKENS, PROMPTS, tiny  # noqa: F401  (tiny: fixture)
from tests.test_glide_decode import echo_glide
from tests.tiny_models import single_thread  # noqa: F401  (autouse fixture)

HAS_ECONOMIZE = importlib.util.find_spec("economize") is not None and ECONOMIZE_RUNS_HERE  # 0.3.2: transformers<5.24

STATS = {
    "target_calls": 3,
    "prefill_calls": 1,
    "draft_len_per_call": [4, 0, 2],
    "levels": [
        {"name": "draft", "forward_calls": 5, "forward_tokens": 9},
        {"name": "maxgram", "forward_calls": 0, "forward_tokens": 0},
    ],
}
DRAFT = DrafterCost("draft", 0.1, 0.02)


# -- the pure functions: golden numbers ----------------------------------------------------------------------
def test_standardized_time_golden():
    # measured-style: prefill 1 + target(4) 1.5 + target(0) 1 + target(2) 1.2 = 4.7;
    # draft 5 * 0.1 + (9 - 5) * 0.02 = 0.58
    measured = Costs(VerifyCost((1.0, 1.0, 1.2, 1.2, 1.5)), (DRAFT, STATISTICAL))
    assert standardized_time(STATS, measured) == pytest.approx(5.28)
    # params-style: every verification one forward (1 + 3 = 4), the draft a quarter of the target per forward
    params = Costs(flat_target, (DrafterCost("draft", 0.25), STATISTICAL))
    assert standardized_time(STATS, params) == pytest.approx(5.25)
    assert plain_time(8) == 8.0
    assert swi([(plain_time(8), 5.25)]) == pytest.approx(8 / 5.25)
    assert swi([(16.0, 8.0), (10.0, 5.0)]) == pytest.approx(2.0)  # sums, not a mean of ratios
    assert swi([(16.0, 8.0), (10.0, 2.0)]) == pytest.approx(26 / 10)
    # transformers' loop: no prefill forward, the first verification runs the prompt
    assert standardized_time({**STATS, "prefill_calls": 0}, params) == pytest.approx(4.25)


def test_unavailable_is_never_invented():
    params = Costs(flat_target, (DrafterCost("draft", 0.25), STATISTICAL))
    assert standardized_time(None, params) is None
    for missing in ("prefill_calls", "draft_len_per_call", "target_calls"):
        assert standardized_time({k: v for k, v in STATS.items() if k != missing}, params) is None
    assert standardized_time({**STATS, "draft_len_per_call": [4, 0]}, params) is None  # one entry per call
    assert standardized_time(STATS, Costs(flat_target, (None, STATISTICAL))) is None  # a drafter that ran, no cost
    assert standardized_time(STATS, Costs(flat_target, (DRAFT,))) is None  # levels do not line up
    assert standardized_time(STATS, Costs(flat_target, (DRAFT, None))) == pytest.approx(4.58)  # no forwards: no cost
    assert standardized_time(STATS, Costs(flat_target, (DRAFT, STATISTICAL), "why")) is None
    no_tokens = {**STATS, "levels": [{"name": "draft", "forward_calls": 5}, STATS["levels"][1]]}
    assert standardized_time(no_tokens, Costs(flat_target, (DRAFT, STATISTICAL))) is None
    assert standardized_time(no_tokens, params) == pytest.approx(5.25)  # no slope: tokens unneeded
    assert swi([]) is None and swi([(8.0, None)]) is None and swi([(None, 4.0)]) is None
    with pytest.raises(ValueError):
        DrafterCost("bad", -1.0)


def test_record_times_and_group_swi():
    costs = {"params": Costs(flat_target, (DrafterCost("draft", 0.25), STATISTICAL))}
    plain = {"new_tokens": 8, "stats": None}
    plain["standardized_time"] = record_times(plain, costs, one_forward_per_token=True)
    mine = {"new_tokens": 8, "stats": STATS}
    mine["standardized_time"] = record_times(mine, costs, one_forward_per_token=False)
    assert plain["standardized_time"] == {"params": 8.0} and mine["standardized_time"] == {
        "params": pytest.approx(5.25)
    }
    assert group_swi([(plain, mine)], ["params"]) == {"params": pytest.approx(8 / 5.25)}
    assert group_swi([(plain, plain)], ["params", "measured"]) == {"params": 1.0, "measured": None}
    assert record_times(mine, {"params": None}, one_forward_per_token=False) == {"params": None}


def test_swi_compares_time_per_generated_token():
    """Sampled outputs end at different lengths: a method that stopped after 2 tokens where plain ran 8 is not
    4x cheaper for it. Per token: plain 1 forward, the method 2.5 (5 forwards for 2 tokens)."""
    assert swi([(8.0, 5.0)], tokens=(8, 2)) == pytest.approx(1.0 / 2.5)
    assert swi([(8.0, 5.0)], tokens=(8, 8)) == pytest.approx(8 / 5.0)  # equal outputs: the plain ratio
    assert swi([(16.0, 8.0), (10.0, 5.0)], tokens=(26, 13)) == pytest.approx(1.0)
    assert swi([(8.0, 5.0)], tokens=(8, 0)) is None and swi([(8.0, 5.0)], tokens=(0, 4)) is None
    plain = {"new_tokens": 8, "standardized_time": {"params": 8.0}}
    short = {"new_tokens": 2, "standardized_time": {"params": 5.0}}
    assert group_swi([(plain, short)], ["params"]) == {"params": pytest.approx(0.4)}
    assert group_swi([(plain, short), (short, plain)], ["params"]) == {"params": pytest.approx(1.0)}


def test_params_costs_count_heads(tiny):
    model, draft, _ = tiny
    target = parameter_count(model)
    assert params_cost(draft, model).per_forward == pytest.approx(parameter_count(draft) / target)
    glide = echo_glide(model)  # shares the target's embeddings: logits through its LM head
    cost = params_cost(glide, model)
    head = parameter_count(model.get_output_embeddings())
    assert cost.per_forward == pytest.approx((parameter_count(glide) + head) / target) and "LM head" in cost.note
    redrafter = random_head(model)
    assert params_cost(redrafter, model).per_forward == pytest.approx(parameter_count(redrafter) / target)


def test_measured_costs_of_every_drafter_kind(tiny):
    model, draft, _ = tiny
    levels = {
        "cascade": [draft, None],
        "glide": [echo_glide(model)],
        "redrafter": [random_head(model)],
        "economize": ["unknown"],
        "mystery": None,
    }
    tables, description = build_costs(["measured"], model, levels)
    t = tables["measured"]
    for method in ("cascade", "glide", "redrafter"):
        neural = [c for c in t[method].drafters if c is not STATISTICAL]
        assert neural and all(c is not None and c.per_forward > 0 and c.per_extra_token >= 0 for c in neural), method
    assert t["cascade"].drafters[1] is STATISTICAL and t["economize"].drafters == (None,)
    assert t["mystery"].unavailable and standardized_time(STATS, t["mystery"]) is None
    assert t["cascade"].target(0) == 1.0 and description["measured"]["target_verify_cost"][0] == 1.0
    assert "errors" not in description["measured"] and len(description["measured"]["drafters"]) == 3


# -- every strategy counts its drafters' forwards (ground truth: forward hooks on the models) -----------------
class _Hook:
    """Calls and tokens (``input_ids`` columns, or rows of the first positional input) of a module's forwards."""

    def __init__(self, module, rows_of_first_arg: bool = False):
        self.calls, self.tokens = 0, 0

        def hook(_m, args, kwargs):
            self.calls += 1
            x = kwargs.get("input_ids") if not rows_of_first_arg else args[0]
            self.tokens += int(x.shape[-1] if not rows_of_first_arg else x.reshape(-1, x.shape[-1]).shape[0])

        self.handle = module.register_forward_pre_hook(hook, with_kwargs=True)


def _generate(model, tok, assistant, prompt=0, n=NEW_TOKENS):
    ids = tok(PROMPTS[prompt]["prompt"], return_tensors="pt").input_ids
    return model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        assistant_model=assistant,
        do_sample=False,
        max_new_tokens=n,
        pad_token_id=0,
    )


def test_cascade_counts_every_drafter_forward(tiny):
    model, draft, tok = tiny
    hook = _Hook(draft.get_decoder())  # every forward runs the decoder (alone with the head: drafters/neural.py)
    assistant = CascadeAssistant([draft, MaxGram()], settings=CascadeSettings(k_matrix=[[2, 3], [0, 3]]))
    _generate(model, tok, assistant)
    hook.handle.remove()
    s = assistant.last_stats
    assert (s.levels[0].forward_calls, s.levels[0].forward_tokens) == (hook.calls, hook.tokens) and hook.calls > 0
    assert s.levels[1].forward_calls == 0 and s.prefill_calls == 1  # Max-Gram runs no forward
    d = s.to_dict()
    assert d["prefill_calls"] == 1 and d["levels"][0]["forward_tokens"] == hook.tokens


def test_transformers_loop_has_no_prefill_call(tiny):
    model, _, tok = tiny
    assistant = CascadeAssistant([MaxGram()])
    assistant.loop = "transformers"
    _generate(model, tok, assistant)
    s = assistant.last_stats
    assert s.prefill_calls == 0 and len(s.draft_len_per_call) == s.target_calls


def test_hsddw_counts_draft_and_pre_verifier_forwards(tiny):
    from tests.test_bench import _llama

    model, draft, tok = tiny
    verifier = _llama(2, 2)
    hooks = _Hook(verifier.get_decoder()), _Hook(draft.get_decoder())  # as in the cascade's test above
    assistant = DynamicWindowAssistant(draft, verifier, settings=DynamicWindowSettings(max_window=4))
    _generate(model, tok, assistant)
    for h in hooks:
        h.handle.remove()
    levels = assistant.last_stats.levels  # [verifier, draft, maxgram]
    assert [(lv.forward_calls, lv.forward_tokens) for lv in levels] == [(h.calls, h.tokens) for h in hooks] + [(0, 0)]
    assert levels[-1].name == "maxgram" and assistant_levels(assistant) == [
        verifier,
        draft,
        None,
    ]  # lookup: no forwards
    assert all(h.calls > 0 for h in hooks)


def test_glide_counts_its_forwards(tiny):
    model, _, tok = tiny
    glide = echo_glide(model)
    hook = _Hook(glide)
    assistant = GlideAssistant(glide, settings=GlideSettings(draft_length=3))
    _generate(model, tok, assistant)
    hook.handle.remove()
    lv, lookup = assistant.last_stats.levels  # the model, then its lookup branch
    assert (lv.forward_calls, lv.forward_tokens) == (hook.calls, hook.tokens) and hook.calls > 0
    assert lookup.name == "lookup" and lookup.forward_calls == 0 and assistant_levels(assistant) == [glide, None]


@pytest.mark.parametrize("width", [1, 3])
def test_redrafter_counts_head_forwards_and_beam_rows(tiny, width):
    model, _, tok = tiny
    head = random_head(model)
    hook = _Hook(head.lm_head, rows_of_first_arg=True)  # one LM-head call per beam step
    assistant = ReDrafterAssistant(head, settings=ReDrafterSettings(beam_width=width, beam_length=3))
    _generate(model, tok, assistant)
    hook.handle.remove()
    s = assistant.last_stats
    lv, lookup = s.levels  # the head, then its lookup branch
    assert lookup.name == "lookup" and lookup.forward_calls == 0 and assistant_levels(assistant) == [head, None]
    assert lv.name == "redrafter" and (lv.forward_calls, lv.forward_tokens) == (hook.calls, hook.tokens)
    assert s.draft_forwards == hook.calls > 0 and s.to_dict()["draft_tokens"] == hook.tokens
    assert (hook.tokens == hook.calls) == (width == 1)


# -- baselines without statistics: counted -------------------------------------------------------------------
def test_transformers_baselines_are_counted(tiny):
    model, draft, tok = tiny
    ids = tok(PROMPTS[0]["prompt"], return_tensors="pt").input_ids
    kwargs = {"max_new_tokens": NEW_TOKENS, "do_sample": False, "pad_token_id": 0}
    hf = build_method("hf-assisted", model, [draft], strategy_kwargs={}, sampling=False)
    out, s = hf.run(ids, torch.ones_like(ids), kwargs)
    assert s["new_tokens"] == out.shape[1] - ids.shape[1] and s["prefill_calls"] == 0
    assert len(s["draft_len_per_call"]) == s["target_calls"] > 0
    # transformers' assistant runs one forward per drafted token (its first over the prompt)
    assert s["levels"][0]["forward_calls"] == sum(s["draft_len_per_call"])
    assert hf.level_models() == [draft]
    pld = build_method("pld", model, [], strategy_kwargs={}, sampling=False)
    out, s = pld.run(ids, torch.ones_like(ids), kwargs)
    assert s["levels"] == [] and len(s["draft_len_per_call"]) == s["target_calls"] > 0
    assert s["target_calls"] <= s["new_tokens"] == out.shape[1] - ids.shape[1]


@pytest.mark.economize
@pytest.mark.skipif(
    not HAS_ECONOMIZE, reason="economize is not installed beside a transformers it runs on (0.3.2: <5.24)"
)
def test_economize_counts_every_target_forward(tiny):
    model, _, tok = tiny
    ids = tok(PROMPTS[0]["prompt"], return_tensors="pt").input_ids
    eco = build_method("economize", model, [], strategy_kwargs={}, sampling=False)
    out, s = eco.run(ids, torch.ones_like(ids), {"max_new_tokens": NEW_TOKENS, "do_sample": False, "pad_token_id": 0})
    plain_forwards = out.shape[1] - ids.shape[1]
    assert len(s["draft_len_per_call"]) == s["target_calls"] <= plain_forwards and s["prefill_calls"] == 0
    assert s["levels"][0]["forward_calls"] == 0  # prompt lookup: no drafter forward
    assert sum(s["acceptance_by_position"]["proposed"][:1]) == sum(n > 0 for n in s["draft_len_per_call"])
    if "accepted_per_call" in s:
        assert len(s["accepted_per_call"]) == s["target_calls"]


# -- the flag ------------------------------------------------------------------------------------------------
def test_cost_model_flag():
    def parse(*extra):
        return bench_config(build_parser().parse_args(["bench", *extra])).cost_models

    assert parse() == ["params", "measured"]
    assert parse("--cost-model", "params") == ["params"]
    assert parse("--cost-model", "measured") == ["measured"]
    assert parse("--cost-model", "both") == ["params", "measured"]
    assert parse("--cost-model", "none") == []
    with pytest.raises(SystemExit):
        build_parser().parse_args(["bench", "--cost-model", "flops"])
    assert parse_cost_models("measured,params") == ["params", "measured"]
    with pytest.raises(ValueError):
        parse_cost_models("params,flops")
    with pytest.raises(ValueError):
        BenchConfig(cost_models=["flops"])
    assert BenchConfig(cost_models=["measured", "params"]).cost_models == ["params", "measured"]


# -- end to end ----------------------------------------------------------------------------------------------
@pytest.mark.economize
def test_bench_reports_swi_for_every_method(tiny, tmp_path):
    model, draft, tok = tiny
    baselines = ["plain", "plain-kernels", "pld", "hf-assisted", "maxgram"] + (["economize"] if HAS_ECONOMIZE else [])
    config = BenchConfig(strategy="cascade", baselines=baselines, max_new_tokens=8, warmup_tokens=2)
    r = run_benchmark(config, model, tok, PROMPTS, drafts=[draft])
    assert set(r.methods) == set(baselines) | {"cascade"}, r.errors
    models = ["params", "measured"]
    for group in [r.summary["overall"], *r.summary["categories"].values()]:
        assert group["plain"]["swi"] == {"params": 1.0, "measured": 1.0}
        assert group["plain-kernels"]["swi"] == {"params": 1.0, "measured": 1.0}
        for m in r.methods:
            assert set(group[m]["swi"]) == set(models) and all(
                v is not None and v > 0 for v in group[m]["swi"].values()
            ), m
    # the params SWI of the cascade, recomputed by hand from its records
    share = parameter_count(draft) / parameter_count(model)
    plain = sum(rec["new_tokens"] for rec in r.records if rec["method"] == "plain")
    mine = [rec["stats"] for rec in r.records if rec["method"] == "cascade"]
    by_hand = sum(s["prefill_calls"] + s["target_calls"] + share * s["levels"][0]["forward_calls"] for s in mine)
    assert r.summary["overall"]["cascade"]["swi"]["params"] == pytest.approx(plain / by_hand)
    # Max-Gram costs nothing: its params SWI is plain's forwards over its own
    mg = [rec["stats"] for rec in r.records if rec["method"] == "maxgram"]
    assert r.summary["overall"]["maxgram"]["swi"]["params"] == pytest.approx(
        plain / sum(s["prefill_calls"] + s["target_calls"] for s in mg)
    )
    assert r.costs["measured"]["target_verify_cost"][0] == 1.0 and r.costs["params"]["target"]["parameters"] > 0
    report = markdown_report(r)
    assert "SWI (params)" in report and "SWI (measured)" in report and "standardized walltime improvement" in report
    write_results(r, tmp_path)
    data = json.loads((tmp_path / "results.json").read_text())
    assert data["summary"]["overall"]["plain"]["swi"] == {"params": 1.0, "measured": 1.0}
    assert set(data["costs"]) == set(models) and all("standardized_time" in rec for rec in data["records"])


def test_bench_without_cost_models(tiny):
    model, _, tok = tiny
    config = BenchConfig(strategy="maxgram", baselines=["plain"], max_new_tokens=4, warmup_tokens=1, cost_models=[])
    r = run_benchmark(config, model, tok, PROMPTS[:1])
    assert r.costs == {} and r.summary["overall"]["maxgram"]["swi"] == {}
    assert "SWI" not in markdown_report(r)
