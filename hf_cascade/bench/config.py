"""Settings of one benchmark run (:class:`BenchConfig`) and the names of the methods it can compare."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

#: Our strategies (``--strategy``).
STRATEGIES = ("maxgram", "cascade", "hsddw", "glide", "redrafter")
#: Baselines (``--baselines``); ``plain`` is always run, it is the reference of every speedup.
BASELINES = ("plain", "plain-kernels", "pld", "pld-tuned", "hf-assisted", "hf-assisted-constant", "hf-assisted-confidence", "economize",
             "maxgram", "maxgram-hf-loop", "maxgram-corpus", "hsddw-single", "glide-chain", "redrafter-w1", "redrafter-flat",
             "suffix", "suffix-tree")


@dataclass
class BenchConfig:
    """What to measure.

    Attributes:
        strategy: ``"maxgram"`` (``CascadeAssistant([MaxGram()])``), ``"cascade"``
            (``CascadeAssistant([*drafts, MaxGram()])``, needs draft models) or ``"hsddw"``
            (``DynamicWindowAssistant(drafts[0], verifier)``, needs a draft model).
        baselines: baselines besides ours; ``"plain"`` is added when missing.
        k_matrix: optional ``n x n`` K-matrix of the cascade (``n`` = drafters including MaxGram).
        lenience: lenience between drafters of the cascade (``>= 1``).
        maxgram_lenience / min_confidence / maxgram_first / keep_unsure / cost_aware: see :class:`~hf_cascade.CascadeAssistant`
            (``min_confidence`` is also ``ReDrafterAssistant``'s and ``GlideAssistant``'s, for every redrafter / glide method).
        draft_length / max_tree_nodes / min_expansion_prob: ``GlideAssistant``'s main-path length, tree-size cap and
            CAPE's expansion floor (strategy glide).
        verify_cost: ``GlideAssistant(verify_cost=VerifyCost.reference())`` (the reference CPU's profile) when true or
            ``"reference"``, the profile :func:`~hf_cascade.core.budget.measure_verify_cost` measures on this
            machine when ``"measure"`` (glide
            methods).
        beam_width / beam_length: ``ReDrafterAssistant``'s beam search (strategy redrafter).
        window: the fixed draft window of the ``hf-assisted-constant`` / ``-confidence`` baselines and HSDDW's
            ``max_window`` (default 10, HSDDW's K).
        max_new_tokens: tokens generated per prompt.
        sampling: ``do_sample=True`` with ``temperature`` (default: greedy).
        temperature: sampling temperature.
        seed: seed of the sampling RNG (reset before every generate of a prompt, per prompt).
        warmup_tokens: new tokens of the untimed warm-up generate of every method.
        corpus: a corpus n-gram file (:meth:`~hf_cascade.CorpusNGrams.save`) for the strategy's Max-Gram
            (``maxgram`` or ``cascade``) and the ``maxgram-corpus`` baseline.
        target / drafts / verifier / prompts_path / per_category: where the CLI loads models and prompts from
            (``verifier``: HSDDW's optional pre-verifier);
            :func:`~hf_cascade.bench.runner.run_benchmark` itself receives loaded objects.
    """

    strategy: str = "maxgram"
    baselines: list[str] = field(default_factory=lambda: ["plain"])
    k_matrix: list[list[int]] | None = None
    lenience: float = 1.0
    maxgram_lenience: float = 1.0
    min_confidence: float = 0.0
    maxgram_first: bool = False
    keep_unsure: bool = True
    cost_aware: bool = False
    window: int = 10
    draft_length: int = 5
    max_tree_nodes: int | None = None
    min_expansion_prob: float = 0.0
    verify_cost: bool | str = False
    beam_width: int = 4
    beam_length: int = 5
    max_new_tokens: int = 128
    sampling: bool = False
    temperature: float = 0.7
    seed: int = 0
    warmup_tokens: int = 8
    target: str | None = None
    drafts: list[str] = field(default_factory=list)
    verifier: str | None = None
    assisted_draft: str | None = None
    prompts_path: str | None = None
    per_category: int = 3
    corpus: str | None = None

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise ValueError(f"unknown strategy {self.strategy!r}; choose from {', '.join(STRATEGIES)}")
        unknown = [b for b in self.baselines if b not in BASELINES]
        if unknown:
            raise ValueError(f"unknown baseline(s) {unknown}; choose from {', '.join(BASELINES)}")
        self.baselines = ["plain"] + [b for b in dict.fromkeys(self.baselines) if b not in ("plain", self.strategy)]
        for name in ("window", "draft_length", "beam_width", "beam_length"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_new_tokens < 1:
            raise ValueError("max_new_tokens must be >= 1")
        if self.lenience < 1.0:
            raise ValueError(f"lenience must be >= 1, got {self.lenience}")
        if self.sampling and self.temperature <= 0:
            raise ValueError("sampling needs temperature > 0")
        if self.strategy == "hsddw" and (self.k_matrix is not None or self.lenience != 1.0):
            raise ValueError("k_matrix and lenience apply to the cascade strategies, not hsddw")
        if self.corpus is not None and self.strategy not in ("maxgram", "cascade") and "maxgram-corpus" not in self.baselines:
            raise ValueError("corpus n-grams are used by strategies maxgram and cascade and the maxgram-corpus baseline")
        if self.verifier is not None and self.strategy != "hsddw":
            raise ValueError("a verifier (pre-verifier model) is only used by strategy hsddw")

    @property
    def tree(self) -> dict:
        """Settings of the tree strategies (see :func:`~hf_cascade.bench.methods.build_method`)."""
        return {"draft_length": self.draft_length, "max_tree_nodes": self.max_tree_nodes,
                "beam_width": self.beam_width, "beam_length": self.beam_length, "min_confidence": self.min_confidence,
                "min_expansion_prob": self.min_expansion_prob, "verify_cost": self.verify_cost}

    @property
    def methods(self) -> list[str]:
        """Every method measured, in the base order of the rotation: the baselines, then ours."""
        return [*self.baselines, self.strategy]

    def to_dict(self) -> dict:
        return asdict(self)


def parse_baselines(text: str | None) -> list[str]:
    """``"pld,economize"`` -> ``["plain", "pld", "economize"]`` (checked against :data:`BASELINES`)."""
    names = [t.strip() for t in (text or "").split(",") if t.strip()]
    unknown = [n for n in names if n not in BASELINES]
    if unknown:
        raise ValueError(f"unknown baseline(s) {unknown}; choose from {', '.join(BASELINES)}")
    return ["plain"] + [n for n in dict.fromkeys(names) if n != "plain"]


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
