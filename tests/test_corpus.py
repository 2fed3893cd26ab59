"""Corpus n-grams (:mod:`hf_cascade.drafters.corpus`): golden counts, lookups and chains, the file format,
Max-Gram's choice between its own match and the corpus, and greedy parity with a corpus on tiny targets."""

from __future__ import annotations

import pytest
import torch

from hf_cascade import CascadeAssistant, CascadeSettings, CorpusNGrams, MaxGram
from hf_cascade.cli import main
from hf_cascade.core.payoff import DraftPolicy
from hf_cascade.drafters.corpus import CORPUS_BUCKETS, CorpusMatch
from hf_cascade.drafters.maxgram import BIGRAM_BUCKET
from hf_cascade.training import DistillStore
from tests import tiny_models as tm
from tests.tiny_models import ids, single_thread  # noqa: F401  (autouse fixture)


def T(*xs):
    return torch.tensor(xs, dtype=torch.long)


# prompt [1, 2], response [3, 1, 2, 4]: the targets 3, 1, 2, 4 after their contexts of 1-2 tokens
SEQ = ([1, 2, 3, 1, 2, 4], 2)
GOLDEN = {
    (2,): (3, 1, 2),
    (1, 2): (3, 1, 2),  # followed by 3 and by 4: the tie goes to the smaller id
    (3,): (1, 1, 1),
    (2, 3): (1, 1, 1),
    (1,): (2, 1, 1),
    (3, 1): (2, 1, 1),
}


# -- counting ----------------------------------------------------------------------------------------


def test_fit_golden():
    corpus = CorpusNGrams.fit([SEQ], vocab_size=8, max_n=2, min_count=1)
    assert corpus.table == GOLDEN
    assert (corpus.vocab_size, corpus.max_n, len(corpus)) == (8, 2, 6)


def test_fit_prunes_rare_contexts_and_counts_responses_only():
    assert CorpusNGrams.fit([SEQ], vocab_size=8, max_n=2, min_count=2).table == {(2,): (3, 1, 2), (1, 2): (3, 1, 2)}
    # start 0 counts from the second token (the first has no context); max_n caps the context
    corpus = CorpusNGrams.fit([([5, 6, 5, 6, 5], 0)], vocab_size=8, max_n=3, min_count=1)
    assert corpus.table == {
        (5,): (6, 2, 2),
        (6,): (5, 2, 2),
        (5, 6): (5, 2, 2),
        (6, 5): (6, 1, 1),
        (5, 6, 5): (6, 1, 1),
        (6, 5, 6): (5, 1, 1),
    }
    # two sequences add up; the majority wins
    corpus = CorpusNGrams.fit([([1, 2], 1), ([1, 3], 1), ([1, 3], 1)], vocab_size=4, max_n=1, min_count=1)
    assert corpus.table == {(1,): (3, 2, 3)}


def test_fit_rejects_bad_input():
    with pytest.raises(ValueError, match="token ids"):
        CorpusNGrams.fit([([1, 9], 1)], vocab_size=8)
    with pytest.raises(ValueError, match="max_n"):
        CorpusNGrams.fit([SEQ], vocab_size=8, max_n=0)
    with pytest.raises(ValueError, match="min_count"):
        CorpusNGrams.fit([SEQ], vocab_size=8, min_count=0)


# -- lookups and chains --------------------------------------------------------------------------------


def test_match_takes_the_longest_known_context():
    corpus = CorpusNGrams(GOLDEN, vocab_size=8, max_n=2)
    assert corpus.match([5, 1, 2]) == CorpusMatch(3, 2, 1, 2)  # (1, 2), not (2,)
    assert corpus.match([5, 2]) == CorpusMatch(3, 1, 1, 2)  # (5, 2) unknown: (2,)
    assert corpus.match([3]) == CorpusMatch(1, 1, 1, 1)
    assert corpus.match([9, 9]) is None
    assert corpus.match([]) is None


def test_chain_follows_and_stops():
    corpus = CorpusNGrams(GOLDEN, vocab_size=8, max_n=2)
    assert corpus.chain([1, 2], 4) == ([3, 1, 2, 3], CorpusMatch(3, 2, 1, 2))
    assert corpus.chain([1, 2], 4, min_confidence=0.5) == ([3, 1, 2, 3], CorpusMatch(3, 2, 1, 2))
    assert corpus.chain([1, 2], 4, min_confidence=0.6) == ([], None)  # the first token is a coin flip
    assert corpus.chain([3], 2, min_confidence=0.6) == ([1, 2], CorpusMatch(1, 1, 1, 1))  # stops before (1, 2)
    assert corpus.chain([1, 2], 0) == ([], None)
    assert corpus.chain([7], 3) == ([], None)


def test_match_confidence_and_buckets():
    assert CorpusMatch(4, 3, 9, 10).confidence == 0.9
    assert CorpusMatch(4, 3, 9, 10).bucket == CORPUS_BUCKETS[(True, 2)] == 20
    assert CorpusMatch(4, 4, 5, 10).bucket == CORPUS_BUCKETS[(True, 1)]
    assert CorpusMatch(4, 3, 4, 10).bucket == CORPUS_BUCKETS[(True, 0)]
    assert CorpusMatch(4, 2, 8, 10).bucket == CORPUS_BUCKETS[(False, 2)]
    assert CorpusMatch(4, 1, 1, 2).bucket == CORPUS_BUCKETS[(False, 1)]
    assert CorpusMatch(4, 1, 1, 3).bucket == CORPUS_BUCKETS[(False, 0)]
    assert len(set(CORPUS_BUCKETS.values())) == 6 and min(CORPUS_BUCKETS.values()) > 6  # not Max-Gram's 0..6


# -- files ---------------------------------------------------------------------------------------------


def test_save_load_round_trip(tmp_path):
    corpus = CorpusNGrams.fit([SEQ, ([4, 4, 4, 1, 2], 1)], vocab_size=8, max_n=3, min_count=1)
    corpus.save(tmp_path / "c.safetensors", data="hand")
    again = CorpusNGrams.load(tmp_path / "c.safetensors")
    assert again.table == corpus.table and (again.vocab_size, again.max_n) == (8, 3)
    empty = CorpusNGrams({}, vocab_size=5, max_n=2)
    empty.save(tmp_path / "e.safetensors")
    assert CorpusNGrams.load(tmp_path / "e.safetensors").table == {}


def test_load_rejects_other_files(tmp_path):
    from safetensors.torch import save_file

    save_file({"x": torch.zeros(2)}, str(tmp_path / "other.safetensors"))
    with pytest.raises(ValueError, match="not an hf_cascade corpus"):
        CorpusNGrams.load(tmp_path / "other.safetensors")
    meta = {"format": "hf_cascade.corpus_ngrams", "vocab_size": "8", "max_n": "1"}
    tensors = {
        "contexts.1": torch.zeros(2, 3, dtype=torch.int32),
        **{f"{k}.1": torch.zeros(2, dtype=torch.int32) for k in ("next", "count", "total")},
    }
    save_file(tensors, str(tmp_path / "bad.safetensors"), metadata=meta)
    with pytest.raises(ValueError, match="shape"):
        CorpusNGrams.load(tmp_path / "bad.safetensors")


def test_from_store_and_cli(tmp_path):
    meta = {"target": "tiny", "prompt_format": "{question}", "max_new_tokens": 8, "hidden_size": 0, "vocab_size": 8}
    store = DistillStore.create_or_resume(tmp_path / "d", meta)
    store.append("r0", "hand", [1, 2], [3, 1, 2, 4], True)
    assert CorpusNGrams.from_store(tmp_path / "d", max_n=2, min_count=1).table == GOLDEN
    assert (
        main(
            [
                "corpus",
                "--data",
                str(tmp_path / "d"),
                "--out",
                str(tmp_path / "c.safetensors"),
                "--max-n",
                "2",
                "--min-count",
                "1",
            ]
        )
        == 0
    )
    assert CorpusNGrams.load(tmp_path / "c.safetensors").table == GOLDEN
    no_vocab = DistillStore.create_or_resume(tmp_path / "n", {**meta, "vocab_size": None})
    no_vocab.append("r0", "hand", [1], [2], True)
    with pytest.raises(ValueError, match="vocab_size"):
        CorpusNGrams.from_store(tmp_path / "n")
    assert CorpusNGrams.from_store(tmp_path / "n", vocab_size=8, min_count=1).table == {(1,): (2, 1, 1)}


# -- Max-Gram with a corpus ----------------------------------------------------------------------------

# contexts of 1-3 tokens of [1 2 3 4], each seen twice: (1, 2, 3) -> 4 with confidence 1 (bucket 20)
CERTAIN = CorpusNGrams.fit([([1, 2, 3, 4], 1)] * 2, vocab_size=16, max_n=3, min_count=2)


def test_maxgram_uses_the_corpus_where_the_sequence_has_nothing():
    mg = MaxGram(max_tokens=3, adaptive=False, corpus=CorpusNGrams(GOLDEN, vocab_size=8, max_n=2))
    prop = mg.propose(T(7, 1, 2), 3, DraftPolicy.lookahead(mg))  # 2 never occurred before: no match
    assert prop.tokens.tolist() == [3, 1, 2] and prop.bucket == CORPUS_BUCKETS[(False, 1)]
    fixed = MaxGram(max_tokens=3, adaptive=False)
    assert fixed.propose(T(7, 1, 2), 3, DraftPolicy.lookahead(mg)).tokens.tolist() == []


def test_maxgram_chooses_by_estimated_acceptance():
    seq = T(3, 9, 1, 2, 3)  # a 1-token match (bucket 1) continuing [9, 1, 2]
    mg = MaxGram(max_tokens=3, adaptive=False, corpus=CERTAIN)
    policy = DraftPolicy.lookahead(mg)
    assert policy.acceptance(20) > policy.acceptance(1)  # prior 0.7 over the 1-token match's 0.4
    prop = mg.propose(seq, 3, policy)
    assert prop.tokens.tolist() == [4] and prop.bucket == 20  # after 4 the corpus knows nothing
    for _ in range(20):
        policy.observe(20, 1, 0)  # the target keeps rejecting the corpus
    assert mg.propose(seq, 3, policy).tokens.tolist() == [9, 1, 2]
    # a match at least corpus_below long never asks the corpus
    assert MaxGram(max_tokens=3, adaptive=False, corpus=CERTAIN, corpus_below=1).propose(
        seq, 3, DraftPolicy.lookahead(mg)
    ).tokens.tolist() == [9, 1, 2]
    long = T(1, 2, 3, 5, 1, 2, 3)  # a 3-token match
    assert mg.propose(long, 3, DraftPolicy.lookahead(mg)).tokens.tolist() == [5, 1, 2]


def test_maxgram_corpus_priors_and_type_check():
    assert 20 in DraftPolicy.lookahead(MaxGram(corpus=CERTAIN)).bucket_priors
    assert 20 not in DraftPolicy.lookahead(MaxGram()).bucket_priors
    user = MaxGram(corpus=CERTAIN, bucket_priors={20: 0.1})
    assert DraftPolicy.lookahead(user).acceptance(20) < 0.3  # user priors win
    with pytest.raises(TypeError, match="CorpusNGrams"):
        MaxGram(corpus={(1,): (2, 1, 1)})
    with pytest.raises(ValueError, match="corpus_below"):
        MaxGram(corpus=CERTAIN, corpus_below=-1)
    with pytest.raises(ValueError, match="corpus_min_confidence"):
        MaxGram(corpus=CERTAIN, corpus_min_confidence=1.5)
    assert MaxGram(corpus=CERTAIN).candidates(T(7, 1)).bucket == BIGRAM_BUCKET  # candidates: the sequence's own


# -- decoding with a corpus: greedy parity on tiny targets ----------------------------------------------

_TARGETS: dict = {}


def _target(name: str) -> dict:
    """A tiny target, a noisy drafter, and corpus n-grams counted over the target's own greedy outputs
    for prompts other than the test's (as ``hf-cascade corpus`` counts the distilled outputs)."""
    if name not in _TARGETS:
        target = tm.llama_target() if name == "llama" else tm.gemma3_target()
        seqs = []
        for p in tm.random_prompts(12, seed=11):
            out = target.generate(p, do_sample=False, max_new_tokens=24)
            seqs.append((out[0].tolist(), p.shape[1]))
        corpus = CorpusNGrams.fit(seqs, vocab_size=target.config.vocab_size, max_n=3, min_count=1)
        _TARGETS[name] = {"target": target, "noisy": tm.noisy_copy(target, noise=0.3), "corpus": corpus}
    return _TARGETS[name]


@pytest.fixture(params=["llama", "gemma3"], scope="module")
def t(request):
    return _target(request.param)


def _counting(corpus: CorpusNGrams) -> tuple[CorpusNGrams, list]:
    """A copy of ``corpus`` that records the chains it hands out."""
    drafts: list = []
    copy = CorpusNGrams(corpus.table, corpus.vocab_size, corpus.max_n)
    inner = copy.chain

    def chain(tokens, k, min_confidence=0.0):
        out = inner(tokens, k, min_confidence)
        drafts.append(out[0])
        return out

    copy.chain = chain
    return copy, drafts


@pytest.mark.parametrize("config", ["maxgram", "maxgram_fixed", "cascade_cost_aware", "cascade"])
@pytest.mark.parametrize(
    "prompt", [ids(1, 5, 6, 7, 5, 6, 7, 5, 6), ids(9), ids(40, 41, 42)], ids=["rep", "one", "three"]
)
def test_greedy_parity_with_corpus(t, config, prompt):
    corpus, drafts = _counting(t["corpus"])
    make = {
        "maxgram": lambda: CascadeAssistant([MaxGram(corpus=corpus)]),
        "maxgram_fixed": lambda: CascadeAssistant([MaxGram(adaptive=False, max_tokens=4, corpus=corpus)]),
        "cascade_cost_aware": lambda: CascadeAssistant(
            [t["noisy"], MaxGram(corpus=corpus)], settings=CascadeSettings(k_matrix=[[3, 10], [0, 10]])
        ),
        "cascade": lambda: CascadeAssistant([t["noisy"], MaxGram(adaptive=False, max_tokens=4, corpus=corpus)]),
    }[config]
    target = t["target"]
    expected = target.generate(prompt, do_sample=False, max_new_tokens=30)
    assistant = make()
    assert (
        target.generate(prompt, do_sample=False, max_new_tokens=30, assistant_model=assistant).tolist()
        == expected.tolist()
    )
    assert any(drafts), "the corpus never drafted: the test would not exercise it"
    again = target.generate(prompt, do_sample=False, max_new_tokens=30, assistant_model=assistant)  # reused
    assert again.tolist() == expected.tolist()


def test_corpus_drafts_are_accepted_and_rejected(t):
    """Across prompts, corpus drafts reach the target and are both accepted and rejected."""
    corpus, drafts = _counting(t["corpus"])
    a = CascadeAssistant([MaxGram(adaptive=False, max_tokens=4, corpus=corpus, corpus_below=99)])
    accepted = proposed = 0
    for p in tm.random_prompts(6, seed=23):
        out = t["target"].generate(p, do_sample=False, max_new_tokens=30, assistant_model=a)
        assert out.tolist() == t["target"].generate(p, do_sample=False, max_new_tokens=30).tolist()
        accepted += a.last_stats.levels[0].tokens_accepted
        proposed += a.last_stats.levels[0].tokens_proposed
    assert any(drafts) and 0 < accepted < proposed


def test_corpus_of_another_vocabulary_is_refused(t):
    wrong = CorpusNGrams({(1,): (2, 1, 1)}, vocab_size=t["target"].config.vocab_size + 5000, max_n=1)
    with pytest.raises(ValueError, match="corpus n-grams"):
        t["target"].generate(
            ids(1, 2), do_sample=False, max_new_tokens=4, assistant_model=CascadeAssistant([MaxGram(corpus=wrong)])
        )
