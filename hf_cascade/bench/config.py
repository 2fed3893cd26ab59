"""Settings of one benchmark run (:class:`BenchConfig`) and the names of the methods it can compare."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from .swi import COST_MODELS

#: Our strategies (``--strategy``, a comma list or ``all``), in the order ``all`` measures them.
STRATEGIES = ("maxgram", "cascade", "hsddw", "glide", "redrafter", "recycling")
#: Baselines (``--baselines``); ``plain`` is always run, it is the reference of every speedup.
BASELINES = (
    "plain",
    "plain-kernels",
    "pld",
    "pld-tuned",
    "hf-assisted",
    "hf-assisted-constant",
    "hf-assisted-confidence",
    "economize",
    "maxgram",
    "maxgram-hf-loop",
    "maxgram-corpus",
    "hsddw-single",
    "hsddw-every-step",
    "glide-chain",
    "redrafter-w1",
    "redrafter-flat",
    "suffix",
    "suffix-tree",
    "plain-compiled",
    "plain-static",
    *(f"{s}-static" for s in STRATEGIES),
)
#: The strategy whose draft models a method uses (methods not listed take none, or the shared ``drafts``).
DRAFT_FAMILY = {
    "cascade": "cascade",
    "hsddw": "hsddw",
    "hsddw-single": "hsddw",
    "hsddw-every-step": "hsddw",
    "glide": "glide",
    "glide-chain": "glide",
    "redrafter": "redrafter",
    "redrafter-w1": "redrafter",
    "redrafter-flat": "redrafter",
    **{f"{s}-static": s for s in ("cascade", "hsddw", "glide", "redrafter")},
}
#: What kind of model each strategy drafts with: one shared ``--draft`` list can only serve strategies of one kind.
DRAFT_KIND = {
    "cascade": "causal LM drafter",
    "hsddw": "causal LM drafter",
    "glide": "GLIDE head",
    "redrafter": "ReDrafter head",
}
#: ``--dtype`` names: the target's (and causal-LM drafts') ``from_pretrained`` dtype.
DTYPES = ("float32", "bfloat16", "float16")
#: The default baselines on a CPU and on an accelerator (``--baselines`` not given; plain is always measured).
DEFAULT_BASELINES = {"cpu": "plain", "accelerator": "plain,plain-compiled"}
#: Options of the cascade, flat (``CascadeSettings``' fields, ``Policy``'s ``cost_aware``, ``maxgram_first`` for
#: ``Policy.lookup``), passed only when set (see :meth:`BenchConfig.cascade_kwargs`).
CASCADE_OPTIONS = (
    "k_matrix",
    "lenience",
    "maxgram_lenience",
    "min_confidence",
    "maxgram_first",
    "keep_unsure",
    "cost_aware",
)


@dataclass
class BenchConfig:
    """What to measure.

    Every option of an assistant defaults to ``None``, "not set": the assistant is then built with its
    library default (the keyword is not passed at all), so a run without options measures each strategy as
    a user gets it from ``CascadeAssistant([drafter, MaxGram()])``, ``GlideAssistant(head)``, ...

    Attributes:
        strategy: one strategy of :data:`STRATEGIES`, several as a comma list or a list
            (``"maxgram,cascade"``), or ``"all"``; every one is measured in the same interleaved rotation.
            Normalised to the comma-joined names (a single strategy stays its name); :attr:`strategies`
            is the list. ``maxgram`` = ``CascadeAssistant([MaxGram()])``; ``cascade`` =
            ``CascadeAssistant([*drafts, MaxGram()])``; ``hsddw`` = ``DynamicWindowAssistant(drafts[0], verifier)``;
            ``glide`` = ``GlideAssistant(drafts[0])``; ``redrafter`` = ``ReDrafterAssistant(drafts[0])``; ``recycling``
            = ``RecyclingAssistant()`` (no draft model).
        baselines: baselines besides ours; ``"plain"`` is added when missing, a name that is also a strategy
            of the run is measured once, as the strategy.
        k_matrix / lenience / maxgram_lenience / min_confidence / maxgram_first / keep_unsure / cost_aware: the
            cascade's options, flat (:class:`~hf_cascade.CascadeSettings`' fields; ``cost_aware`` and
            ``maxgram_first`` are its :class:`~hf_cascade.Policy`'s ``cost_aware`` and ``lookup``); they go to the
            ``cascade`` method, and to
            Max-Gram alone (``maxgram``, ``maxgram-hf-loop``) only in a run without the cascade (with the cascade
            Max-Gram alone is its reference and runs with its defaults). ``min_confidence`` is also
            ``ReDrafterAssistant``'s and ``GlideAssistant``'s, for every redrafter / glide method.
        draft_length / max_tree_nodes / min_expansion_prob: ``GlideAssistant``'s main-path length, tree-size cap and
            CAPE's expansion floor (glide methods).
        verify_cost: ``GlideAssistant(policy=Policy(verify_cost=VerifyCost.reference()))`` (the reference CPU's
            profile) when true or ``"reference"``, the profile :func:`~hf_cascade.measure.measure_verify_cost`
            measures on this machine when ``"measure"`` (glide methods); false: not passed.
        beam_width / beam_length: ``ReDrafterAssistant``'s beam search (redrafter methods).
        window: HSDDW's ``max_window`` and the fixed draft window of the ``hf-assisted-constant`` / ``-confidence``
            baselines (not set: HSDDW's default, and :data:`~hf_cascade.bench.peers.ASSISTED_WINDOW` for them).
        max_new_tokens: tokens generated per prompt.
        sampling: ``do_sample=True`` with ``temperature`` (default: greedy).
        temperature: sampling temperature.
        seed: seed of the sampling RNG (reset before every generate of a prompt, per prompt).
        draws: runs of every prompt through every method, each with its own seed: under sampling, more draws of
            each prompt's output distribution (outputs, and so their lengths, differ between methods by chance;
            a category's cell pools its draws).
        warmup_tokens: new tokens of the untimed warm-up generate of every method.
        corpus: a corpus n-gram file (:meth:`~hf_cascade.CorpusNGrams.save`) for the strategies ``maxgram`` and
            ``cascade`` and the ``maxgram-corpus`` baseline.
        drafts: draft model specs shared by every strategy without its own in ``strategy_drafts`` (the old
            single-strategy ``--draft PATH``; also the ``hf-assisted*`` baselines' draft); the strategies they
            serve must take one kind of model (:data:`DRAFT_KIND`).
        strategy_drafts: draft model specs per strategy (``{"glide": ["path"], "cascade": ["big", "small"]}``,
            ``--draft glide=PATH``), also used by that strategy's variants (``glide-chain``, ``hsddw-single``, ...).
            The CLI fills in the shipped heads it chose for the default target.
        target / verifier / assisted_draft / prompts_path / per_category: where the CLI loads models and prompts
            from (``verifier``: HSDDW's optional pre-verifier);
        prompt_format: ``"plain"`` (default), each question's first turn in the completion template
            (:data:`hf_cascade.data.PROMPT_FORMAT`), or ``"chat"``, as a user turn through the target tokenizer's
            chat template (an instruct model as ``pipeline`` prompts it; :func:`hf_cascade.data.chat_prompt_ids`);
            left out of :meth:`to_dict` when plain (results as before).
        cost_models: the standardized walltime improvement's cost models (:mod:`hf_cascade.bench.swi`):
            ``"params"`` (a forward costs its parameter count), ``"measured"`` (this machine's per-row costs,
            measured before the timed runs); both by default, ``[]`` for none.
            :func:`~hf_cascade.bench.runner.run_benchmark` itself receives loaded objects.
        batch_sizes: batch sizes of the batched sweep run after the single-prompt runs (``--batch-size 1,2,4,8``;
            :mod:`hf_cascade.bench.batched`), ascending, once each; ``[]`` (default): no sweep, and the key is
            left out of :meth:`to_dict` (results as before).
        device / dtype / device_map / attn_implementation: where and how the CLI loads the target (``device``: a
            torch device, where the target goes without ``device_map``; ``dtype``: one of :data:`DTYPES`;
            ``device_map``: ``from_pretrained``'s, e.g. ``"auto"``; ``attn_implementation``: e.g. ``"sdpa"``,
            ``"flash_attention_2"``, ``None``: transformers' default). The CLI's defaults follow the machine
            (:func:`default_device`, :func:`default_dtype`); unset map and attention are left out of :meth:`to_dict`.
    """

    strategy: str | list[str] = "maxgram"
    baselines: list[str] = field(default_factory=lambda: ["plain"])
    k_matrix: list[list[int]] | None = None
    lenience: float | None = None
    maxgram_lenience: float | None = None
    min_confidence: float | None = None
    maxgram_first: bool | None = None
    keep_unsure: bool | None = None
    cost_aware: bool | None = None
    window: int | None = None
    draft_length: int | None = None
    max_tree_nodes: int | None = None
    min_expansion_prob: float | None = None
    verify_cost: bool | str = False
    beam_width: int | None = None
    beam_length: int | None = None
    max_new_tokens: int = 128
    sampling: bool = False
    temperature: float = 0.7
    seed: int = 0
    draws: int = 1
    warmup_tokens: int = 8
    target: str | None = None
    drafts: list[str] = field(default_factory=list)
    strategy_drafts: dict[str, list[str]] = field(default_factory=dict)
    verifier: str | None = None
    assisted_draft: str | None = None
    prompts_path: str | None = None
    per_category: int = 3
    prompt_format: str = "plain"
    corpus: str | None = None
    cost_models: list[str] = field(default_factory=lambda: list(COST_MODELS))
    batch_sizes: list[int] = field(default_factory=list)
    device: str = "cpu"
    dtype: str = "float32"
    device_map: str | dict | None = None
    attn_implementation: str | None = None
    strategies: list[str] = field(init=False, default_factory=list)

    def __post_init__(self) -> None:
        self.strategies = parse_strategies(self.strategy)
        self.strategy = ",".join(self.strategies)
        unknown = [b for b in self.baselines if b not in BASELINES]
        if unknown:
            raise ValueError(f"unknown baseline(s) {unknown}; choose from {', '.join(BASELINES)}")
        self.baselines = ["plain"] + [b for b in dict.fromkeys(self.baselines) if b not in ("plain", *self.strategies)]
        for name in ("window", "draft_length", "beam_width", "beam_length"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.prompt_format not in ("plain", "chat"):
            raise ValueError(f"prompt_format must be 'plain' or 'chat', got {self.prompt_format!r}")
        if self.draws < 1:
            raise ValueError(f"draws must be >= 1, got {self.draws}")
        if self.max_new_tokens < 1:
            raise ValueError("max_new_tokens must be >= 1")
        if self.lenience is not None and self.lenience < 1.0:
            raise ValueError(f"lenience must be >= 1, got {self.lenience}")
        if self.sampling and self.temperature <= 0:
            raise ValueError("sampling needs temperature > 0")
        methods = set(self.methods)
        if (self.k_matrix is not None or self.lenience is not None) and not methods & {
            "maxgram",
            "maxgram-hf-loop",
            "cascade",
        }:
            raise ValueError(f"k_matrix and lenience apply to the cascade strategies, not {', '.join(self.strategies)}")
        if (
            self.corpus is not None
            and not {"maxgram", "cascade"} & set(self.strategies)
            and "maxgram-corpus" not in methods
        ):
            raise ValueError(
                "corpus n-grams are used by strategies maxgram and cascade and the maxgram-corpus baseline"
            )
        if self.verifier is not None and "hsddw" not in self.strategies:
            raise ValueError("a verifier (pre-verifier model) is only used by strategy hsddw")
        unknown = [m for m in self.cost_models if m not in COST_MODELS]
        if unknown:
            raise ValueError(f"unknown cost model(s) {unknown}; choose from {', '.join(COST_MODELS)}")
        self.cost_models = [m for m in COST_MODELS if m in self.cost_models]
        self.batch_sizes = parse_batch_sizes(self.batch_sizes)
        if self.dtype not in DTYPES:
            raise ValueError(f"unknown dtype {self.dtype!r}; choose from {', '.join(DTYPES)}")
        try:
            self.device = str(torch.device(self.device))  # a bad name raises here, before anything loads
        except RuntimeError as exc:
            raise ValueError(f"unknown device {self.device!r}: {exc}") from exc
        self._check_drafts()

    def _check_drafts(self) -> None:
        """Per-strategy drafts name a strategy that uses them; shared drafts serve strategies of one kind."""
        self.strategy_drafts = {k: list(v) for k, v in self.strategy_drafts.items()}
        families = self.draft_families
        for name in self.strategy_drafts:
            if name not in DRAFT_KIND:
                raise ValueError(f"no draft models for {name!r}: strategies with drafts are {', '.join(DRAFT_KIND)}")
            if name not in families:
                raise ValueError(f"drafts given for {name!r}, which this run does not measure")
        shared = [f for f in families if f not in self.strategy_drafts]
        kinds = {DRAFT_KIND[f] for f in shared}
        if self.drafts and len(kinds) > 1:
            raise ValueError(
                f"--draft PATH without a strategy name is shared by {', '.join(shared)}, which take "
                f"different models ({', '.join(sorted(kinds))}); name the strategy: --draft "
                + " ".join(f"{f}=PATH" for f in shared)
            )

    @property
    def draft_families(self) -> list[str]:
        """The strategies whose draft models this run uses (:data:`DRAFT_FAMILY` of every method), in method order."""
        return list(dict.fromkeys(DRAFT_FAMILY[m] for m in self.methods if m in DRAFT_FAMILY))

    def drafts_of(self, family: str) -> list[str]:
        """Draft specs of one strategy: its own (``strategy_drafts``), else the shared ``drafts``."""
        return list(self.strategy_drafts.get(family) or self.drafts)

    def cascade_kwargs(self, maxgram_alone: bool = False) -> dict:
        """The cascade options that are set (:data:`CASCADE_OPTIONS`), for ``CascadeAssistant``; for Max-Gram
        alone (``maxgram_alone``) none when the cascade is measured in the same run."""
        if maxgram_alone and "cascade" in self.methods:
            return {}
        return {k: getattr(self, k) for k in CASCADE_OPTIONS if getattr(self, k) is not None}

    @property
    def tree(self) -> dict:
        """Settings of the tree strategies that are set (see :func:`~hf_cascade.bench.build.build_method`)."""
        values = {
            "draft_length": self.draft_length,
            "max_tree_nodes": self.max_tree_nodes,
            "beam_width": self.beam_width,
            "beam_length": self.beam_length,
            "min_confidence": self.min_confidence,
            "min_expansion_prob": self.min_expansion_prob,
            "verify_cost": self.verify_cost or None,
        }
        return {k: v for k, v in values.items() if v is not None}

    @property
    def methods(self) -> list[str]:
        """Every method measured, in the base order of the rotation: the baselines, then ours."""
        return [*self.baselines, *self.strategies]

    def to_dict(self) -> dict:
        out = asdict(self)
        if not self.batch_sizes:
            del out["batch_sizes"]
        if self.prompt_format == "plain":
            del out["prompt_format"]
        for key in ("device_map", "attn_implementation"):
            if out[key] is None:
                del out[key]
        return out


def default_device() -> str:
    """The device a benchmark runs on when none is given: the first available accelerator (CUDA, XPU, MPS), else
    the CPU."""
    if torch.cuda.is_available():
        return "cuda"
    if hasattr(torch, "xpu") and torch.xpu.is_available():
        return "xpu"
    if torch.backends.mps.is_available():
        return "mps"
    return "cpu"


def is_accelerator(device: str) -> bool:
    """Whether ``device`` names an accelerator (anything but the CPU)."""
    return torch.device(device).type != "cpu"


def default_dtype(device: str) -> str:
    """The target's dtype when none is given: float32 on a CPU (hf_cascade's CPU kernels), bfloat16 on an
    accelerator."""
    return "bfloat16" if is_accelerator(device) else "float32"


def default_baselines(device: str) -> str:
    """The baselines when none are given (:data:`DEFAULT_BASELINES`): plain on a CPU; on an accelerator plain and
    plain-compiled (a static cache compiled by transformers: what a GPU user runs)."""
    return DEFAULT_BASELINES["accelerator" if is_accelerator(device) else "cpu"]


def parse_strategies(text: str | list[str] | tuple[str, ...]) -> list[str]:
    """``"maxgram,cascade"`` (or a list of names) -> ``["maxgram", "cascade"]``; ``"all"`` -> :data:`STRATEGIES`
    (checked; duplicates dropped, order kept)."""
    names = [t.strip() for t in (text.split(",") if isinstance(text, str) else text) if t.strip()]
    if "all" in names:
        names = [*STRATEGIES, *(n for n in names if n != "all")]
    unknown = [n for n in names if n not in STRATEGIES]
    if unknown or not names:
        raise ValueError(
            f"unknown strategy {', '.join(map(repr, unknown)) or repr(text)}; choose from "
            f"{', '.join(STRATEGIES)} (a comma list) or all"
        )
    return list(dict.fromkeys(names))


def parse_drafts(specs: list[str] | None) -> tuple[list[str], dict[str, list[str]]]:
    """``--draft`` values -> ``(shared, per_strategy)``: ``NAME=PATH`` with ``NAME`` a strategy that drafts with a
    model (:data:`DRAFT_KIND`) goes to that strategy (repeat it for several drafters, largest first), anything
    else is a shared spec: ``["big", "glide=g", "cascade=a", "cascade=b"]`` ->
    ``(["big"], {"glide": ["g"], "cascade": ["a", "b"]})``."""
    shared: list[str] = []
    per: dict[str, list[str]] = {}
    for spec in specs or []:
        name, sep, path = spec.partition("=")
        if sep and name in STRATEGIES:
            if name not in DRAFT_KIND:
                raise ValueError(f"--draft {spec}: strategy {name!r} takes no draft model")
            if not path:
                raise ValueError(f"--draft {spec}: give the model after '='")
            per.setdefault(name, []).append(path)
        else:
            shared.append(spec)
    return shared, per


def parse_baselines(text: str | None) -> list[str]:
    """``"pld,economize"`` -> ``["plain", "pld", "economize"]`` (checked against :data:`BASELINES`)."""
    names = [t.strip() for t in (text or "").split(",") if t.strip()]
    unknown = [n for n in names if n not in BASELINES]
    if unknown:
        raise ValueError(f"unknown baseline(s) {unknown}; choose from {', '.join(BASELINES)}")
    return ["plain"] + [n for n in dict.fromkeys(names) if n != "plain"]


def parse_batch_sizes(text: str | list[int] | tuple[int, ...] | None) -> list[int]:
    """``--batch-size``: ``"1,2,4,8"`` (or a list) -> ``[1, 2, 4, 8]``, ascending, once each, every one ``>= 1``;
    ``None`` / ``""`` -> ``[]`` (no batched sweep)."""
    if text is None:
        return []
    items = text.split(",") if isinstance(text, str) else list(text)
    try:
        sizes = [int(str(t).strip()) for t in items if str(t).strip()]
    except ValueError as exc:
        raise ValueError(f"batch sizes are a comma list of integers (e.g. 1,2,4,8), got {text!r}") from exc
    if any(b < 1 for b in sizes):
        raise ValueError(f"batch sizes must be >= 1, got {text!r}")
    return sorted(set(sizes))


def parse_cost_models(text: str | None) -> list[str]:
    """``--cost-model``: ``"params"``, ``"measured"``, ``"both"`` (or a comma list) -> the cost models;
    ``"none"`` -> ``[]``."""
    names = [t.strip() for t in (text or "both").split(",") if t.strip()]
    if names == ["none"]:
        return []
    out = [m for n in names for m in (COST_MODELS if n == "both" else (n,))]
    unknown = [n for n in out if n not in COST_MODELS]
    if unknown:
        raise ValueError(f"unknown cost model(s) {unknown}; choose from {', '.join(COST_MODELS)}, both or none")
    return [m for m in COST_MODELS if m in out]


def parse_k_matrix(text: str | None) -> list[list[int]] | None:
    """A K-matrix given as JSON text (``"[[2, 10], [0, 10]]"``) or as the path of a JSON file."""
    if text is None:
        return None
    path = Path(text)
    raw = path.read_text() if not text.lstrip().startswith("[") and path.is_file() else text
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ValueError(f"--k-matrix is neither JSON nor a JSON file: {text!r}") from exc
    if not (isinstance(value, list) and all(isinstance(r, list) for r in value)):
        raise ValueError(f"--k-matrix must be a list of lists of ints, got {value!r}")
    return [[int(x) for x in row] for row in value]
