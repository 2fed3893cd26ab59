"""Tree-verified decoding through ``generate()``, continued from test_tree_decode.py: stops (EOS, max
length, custom criteria) cut accepted paths where plain decoding stops; scores, logits, streamer and
pipeline match plain ``generate``; an assistant is reused across calls; unsupported inputs fail clearly."""

from __future__ import annotations

import pytest
import torch
from transformers import StoppingCriteria, StoppingCriteriaList, pipeline

from hf_cascade import CascadeAssistant, LossyLenientTarget, MaxGram
from hf_cascade.core.stats import TreeStats
from hf_cascade.maxgram_tree import MaxGramTreeAssistant
from tests import tiny_models as tm
from tests.test_greedy_parity import REPETITIVE, Collect, assert_same_outputs, models, plain
from tests.test_tree_decode import NEW, Oracle, Using, assert_parity, m, ours  # noqa: F401  (m: fixture)
from tests.tiny_models import ids, single_thread  # noqa: F401  (autouse fixture)

# -- stops: EOS, max length, custom criteria, cut in the middle of an accepted path -------------------


def test_eos_inside_an_accepted_path(m):
    target = m["target"]
    free = plain(target, REPETITIVE, max_new_tokens=40)[0, REPETITIVE.shape[1] :].tolist()
    eos = free[6]
    first = free.index(eos)
    expected = plain(target, REPETITIVE, max_new_tokens=40, eos_token_id=eos)
    assert expected.shape[1] == REPETITIVE.shape[1] + first + 1
    depth = 4 if first % 5 != 4 else 3  # the oracle's steps emit depth + 1 tokens: EOS lands on a node
    for a in (MaxGramTreeAssistant(), Using(lambda: Oracle(expected[0].tolist(), depth=depth))):
        got = ours(target, REPETITIVE, a, max_new_tokens=40, eos_token_id=eos)
        assert got.tolist() == expected.tolist()
        assert a.last_stats.new_tokens == first + 1
    # the oracle's last step accepted the EOS node itself: the bonus token after it was cut
    st = a.last_stats
    assert len(st.accepted_paths[-1]) == st.accepted_per_call[-1] + 1


class StopAtLength(StoppingCriteria):
    """A custom criterion the loop cannot prune for: stops once the sequence has ``n`` tokens."""

    def __init__(self, n):
        self.n = n

    def __call__(self, input_ids, scores, **kwargs):
        return torch.full((input_ids.shape[0],), input_ids.shape[1] >= self.n, dtype=torch.bool)


@pytest.mark.parametrize("new", [1, 2, 3, 5, 7])
def test_max_new_tokens_and_custom_stops_mid_path(m, new):
    target = m["target"]
    # max_new_tokens: the tree is pruned to the budget, outputs stay equal
    stats = assert_parity(target, REPETITIVE, MaxGramTreeAssistant(depth=10), max_new_tokens=new)
    assert stats.new_tokens == new
    assert all(d <= new - 1 for d in stats.tree_depths)
    # a custom criterion stops inside an accepted path
    free = plain(target, REPETITIVE, max_new_tokens=40)[0].tolist()
    stop = lambda: StoppingCriteriaList([StopAtLength(REPETITIVE.shape[1] + new)])  # noqa: E731
    expected = plain(target, REPETITIVE, max_new_tokens=40, stopping_criteria=stop())
    assert expected.shape[1] == REPETITIVE.shape[1] + new
    a = Using(lambda: Oracle(free, depth=6))
    got = ours(target, REPETITIVE, a, max_new_tokens=40, stopping_criteria=stop())
    assert got.tolist() == expected.tolist()
    st = a.last_stats
    assert st.new_tokens == new
    if new % 7:  # 7 tokens per full step
        assert len(st.accepted_paths[-1]) + 1 > st.accepted_per_call[-1] + 1  # the path was cut


# -- outputs: scores, logits, cache, streamer, pipeline -------------------------------------------------------


@pytest.mark.parametrize("extra", [{}, {"repetition_penalty": 1.5}], ids=["plain", "repetition_penalty"])
def test_scores_and_logits_match_plain(m, extra):
    target = m["target"]
    kw = dict(max_new_tokens=20, return_dict_in_generate=True, output_scores=True, output_logits=True, **extra)
    expected = plain(target, REPETITIVE, **kw)
    for a in (MaxGramTreeAssistant(), Using(lambda: Oracle(expected.sequences[0].tolist(), depth=3))):
        got = ours(target, REPETITIVE, a, **kw)
        assert type(got).__name__ == "GenerateDecoderOnlyOutput"
        assert_same_outputs(got, expected, 20)
        cache = got.past_key_values
        if hasattr(cache, "get_seq_length"):  # 4.57 may hand back a legacy tuple
            assert cache.get_seq_length() == got.sequences.shape[1] - 1


def test_streamer_receives_exactly_the_generated_tokens(m):
    target = m["target"]
    expected = plain(target, REPETITIVE)
    s = Collect()
    got = ours(target, REPETITIVE, MaxGramTreeAssistant(), streamer=s)
    assert got.tolist() == expected.tolist()
    assert s.chunks[0] == REPETITIVE[0].tolist()
    assert sum(s.chunks[1:], []) == got[0, REPETITIVE.shape[1] :].tolist()
    assert s.ended == 1
    assert len(s.chunks) - 1 < NEW  # some chunks hold several tokens


def test_pipeline(m):
    target, tok = m["target"], tm.word_tokenizer()
    text = "w5 w6 w7 w5 w6 w7 w5 w6"
    kw = dict(max_new_tokens=25, do_sample=False)
    expected = pipeline("text-generation", model=target, tokenizer=tok)(text, **kw)[0]["generated_text"]
    a = MaxGramTreeAssistant()
    pipe = pipeline("text-generation", model=target, tokenizer=tok)
    assert pipe(text, assistant_model=a, **kw)[0]["generated_text"] == expected
    assert a.last_stats.new_tokens == 25


# -- linear drafts in the core (reusing an assistant across calls: tests/test_contract.py) ----------------------


def test_linear_assistants_record_chains(m):
    """Linear assistants run in the same core: a chain per step, recorded in the same statistics."""
    target = m["target"]
    c = CascadeAssistant([MaxGram()])
    assert ours(target, REPETITIVE, c).tolist() == plain(target, REPETITIVE).tolist()
    assert isinstance(c.last_stats, TreeStats) and set(c.last_stats.tree_leaves) <= {0, 1}


def test_errors():
    target = models("llama")["target"]
    a = MaxGramTreeAssistant()
    for do_sample in (False, True):
        with pytest.raises(ValueError, match="beam"):
            ours(target, REPETITIVE, a, num_beams=2, do_sample=do_sample)
    with pytest.raises(ValueError, match="lossy target rules"):
        ours(target, REPETITIVE, a, logits_processor=[LossyLenientTarget(2.0)])
    with pytest.raises(ValueError, match="use_cache"):
        ours(target, REPETITIVE, a, use_cache=False)
    with pytest.raises(ValueError, match="dynamic or a static cache"):
        ours(target, REPETITIVE, a, cache_implementation="offloaded")
    with pytest.raises(ValueError, match="attentions or hidden states"):
        ours(target, REPETITIVE, a, return_dict_in_generate=True, output_attentions=True)
    with pytest.raises(ValueError, match="left padding"):  # right padding is refused
        ours(target, REPETITIVE, a, attention_mask=torch.cat([torch.ones(1, 8), torch.zeros(1, 1)], 1).long())
    with pytest.raises(RuntimeError, match="tree assistant"):
        a.candidate_generator(target, REPETITIVE, target.generation_config, None, {})
    # nothing half-installed: the same assistant works afterwards
    assert ours(target, REPETITIVE, a).tolist() == plain(target, REPETITIVE).tolist()
