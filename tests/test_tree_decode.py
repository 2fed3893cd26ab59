"""Tree-verified assisted decoding through ``generate()`` (hf_cascade.core.loop, .strategy,
.maxgram_tree): greedy outputs equal plain ``generate``; the output head runs only on the rows
acceptance reads; non-first branches are accepted; the drafter sees the target's true cache and last
hidden state. Stops, scores, streams, reuse and errors: test_tree_decode_outputs.py; sampling: the
statistical tests of test_sampling.py."""

from __future__ import annotations

import pytest
import torch
from transformers import LogitsProcessorList

from hf_cascade import MaxGram
from hf_cascade.assistant import TreeAssistant
from hf_cascade.core import TokenTree, greedy_tree_accept
from hf_cascade.core.rows import TreeRows
from hf_cascade.core.stats import TreeStats
from hf_cascade.core.stopping import prune_tree
from hf_cascade.core.strategy import TreeDrafter
from hf_cascade.core.structure import prefix_tree
from hf_cascade.maxgram_tree import MaxGramTree, MaxGramTreeAssistant
from tests import tiny_models as tm
from tests.test_greedy_parity import ONE_TOKEN, REPETITIVE, _processor_kwargs, models, plain
from tests.tiny_models import ids, single_thread  # noqa: F401  (autouse fixture)

T = torch.tensor
NEW = 30


@pytest.fixture(params=["llama", "gemma3"], scope="module")
def m(request):
    return models(request.param)


def ours(target, prompt, assistant, **kw):
    kw.setdefault("max_new_tokens", NEW)
    kw.setdefault("do_sample", False)
    return target.generate(prompt, assistant_model=assistant, **kw)


def assert_parity(target, prompt, assistant, **kw):
    expected = plain(target, prompt, **kw)
    got = ours(target, prompt, assistant, **kw)
    assert got.tolist() == expected.tolist()
    stats = assistant.last_stats
    assert isinstance(stats, TreeStats) and stats.target_calls >= 1
    assert stats.new_tokens == got.shape[1] - prompt.shape[1]
    assert len(stats.tree_sizes) == len(stats.accepted_per_call) == stats.target_calls
    return stats


class Using(TreeAssistant):
    """A tree assistant around a drafter factory (one fresh drafter per call)."""

    def __init__(self, make):
        self.make = make
        self.cpu_kernels = False

    def new_drafter(self, target, generation_config, logits_processor, stats=None, target_tokenizer=None):
        return self.make()


class Oracle(TreeDrafter):
    """Knows the expected output: proposes ``[wrong, right]`` beams of ``depth`` tokens (the right
    one second), and records what the loop hands it."""

    def __init__(self, expected: list[int], depth: int = 4, vocab: int = tm.VOCAB):
        self.expected, self.depth, self.vocab = expected, depth, vocab
        self.states = []

    def draft_tree(self, seq, state):
        self.states.append(
            (
                seq.clone(),
                state.cache.get_seq_length(),
                None if state.last_hidden is None else state.last_hidden.clone(),
                state.budget,
            )
        )
        right = self.expected[seq.shape[0] : seq.shape[0] + self.depth]
        if not right:
            return TokenTree(seq.new_zeros(0), seq.new_zeros(0)), None
        wrong = [(right[0] + 1) % self.vocab] + right[1:]
        tree, _, _ = prefix_tree(T([wrong, right]))
        return tree, None

    def on_accept(self, tree, acceptance, state):
        # the state after a step (the last one included, even when cut): the cache holds seq[:-1]
        assert state.cache.get_seq_length() == state.seq.shape[0] - 1
        assert acceptance.path.shape[0] <= tree.num_nodes


# -- greedy parity -----------------------------------------------------------------------------------

# MaxGramTreeAssistant() (the default): tests/test_contract.py, on every target setting
CONFIGS = {
    "chain": lambda: MaxGramTreeAssistant(branches=1, depth=8),
    "wide": lambda: MaxGramTreeAssistant(branches=6, depth=3, max_ngram=3),
    "deep": lambda: MaxGramTreeAssistant(branches=2, depth=12, cpu_kernels=False),
}


@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("prompt", [REPETITIVE, ONE_TOKEN], ids=["repetitive", "one_token"])
def test_greedy_parity(m, config, prompt):
    assert_parity(m["target"], prompt, CONFIGS[config]())


BRANCHING = ids(1, 5, 6, 7, 5, 6, 8, 5, 6, 9, 5, 6)  # "5 6" followed by 7, 8 and 9


def test_trees_are_accepted_and_rejected(m):
    stats = assert_parity(m["target"], REPETITIVE, MaxGramTreeAssistant(), max_new_tokens=60)
    assert stats.tokens_per_target_call > 1.3
    stats = assert_parity(m["target"], BRANCHING, MaxGramTreeAssistant(), max_new_tokens=60)
    assert max(stats.tree_leaves) >= 3  # real trees, not only chains
    assert any(n < d for n, d in zip(stats.accepted_per_call, stats.tree_depths))  # rejections happen
    assert sum(stats.acceptance_by_position.proposed) > sum(stats.acceptance_by_position.accepted) > 0


def test_long_generation_through_sliding_window(m):
    """Sequences many times the sliding window (8 on Gemma3), trees deeper than the window."""
    assert_parity(m["target"], REPETITIVE, MaxGramTreeAssistant(branches=3, depth=10), max_new_tokens=80)


@pytest.mark.parametrize("name", ["repetition_penalty", "no_repeat_ngram_size", "combined"])
def test_logits_processors(m, name):
    target = m["target"]
    kw = _processor_kwargs(target, name)
    assert plain(target, REPETITIVE, **kw).tolist() != plain(target, REPETITIVE).tolist()
    assert_parity(target, REPETITIVE, MaxGramTreeAssistant(), **kw)
    # an oracle tree: every step verifies two branches whose rows need different processed logits
    expected = plain(target, REPETITIVE, **kw)[0].tolist()
    assert_parity(target, REPETITIVE, Using(lambda: Oracle(expected)), **kw)


def test_output_head_runs_only_on_the_rows_acceptance_reads(m):
    """Verification runs the decoder on every node, the output head on the walked rows only."""
    stats = assert_parity(m["target"], BRANCHING, MaxGramTreeAssistant(), max_new_tokens=60)
    verified = [n + 1 for n in stats.tree_sizes]
    assert all(1 <= r <= v for r, v in zip(stats.head_rows, verified))
    assert sum(stats.head_rows) < sum(verified)
    assert stats.to_dict()["head_rows"] == stats.head_rows


def test_output_head_reproduces_gemma_softcapping():
    target = tm.gemma3(seed=3)
    target.config.final_logit_softcapping = 0.5  # strong: changes every distribution
    stats = assert_parity(target, BRANCHING, MaxGramTreeAssistant(), max_new_tokens=40)
    assert sum(stats.head_rows) < sum(n + 1 for n in stats.tree_sizes)
    assert_parity(target, BRANCHING, MaxGramTreeAssistant(), max_new_tokens=40, repetition_penalty=1.5)


def test_full_logits_when_the_head_is_not_reproduced():
    """A target whose forward changes the head's logits: every row comes from its own forward."""

    class ScaledLogits(type(tm.llama())):
        def forward(self, *args, **kwargs):
            out = super().forward(*args, **kwargs)
            out.logits = out.logits * 3 - 1
            return out

    target = tm.llama(seed=4)
    target.__class__ = ScaledLogits
    kw = dict(max_new_tokens=40, output_logits=True, return_dict_in_generate=True)
    expected = target.generate(BRANCHING, do_sample=False, **kw)
    a = MaxGramTreeAssistant()
    got = ours(target, BRANCHING, a, **kw)
    assert got.sequences.tolist() == expected.sequences.tolist()
    assert a.last_stats.head_rows == [n + 1 for n in a.last_stats.tree_sizes]
    for a, b in zip(got.logits, expected.logits):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


def test_tree_rows_process_each_row_with_its_ancestor_path():
    """Row i + 1 is processed with seq + the path to node i (a recording processor), only when read."""
    seen = []

    class Record:
        def __call__(self, input_ids, scores):
            seen.append(input_ids[0].tolist())
            return scores + input_ids.shape[1]

    tree = TokenTree(T([10, 11, 12, 13]), T([-1, 0, -1, 2]))
    raw = torch.zeros(5, 20)
    rows = TreeRows(tree, T([1, 2]), LogitsProcessorList([Record()]), raw=raw)
    assert [float(rows[r][0]) for r in (0, 1, 2, 3, 4)] == [2, 3, 4, 3, 4]
    assert seen == [[1, 2], [1, 2, 10], [1, 2, 10, 11], [1, 2, 12], [1, 2, 12, 13]]
    rows[3]
    assert len(seen) == 5  # processed once per row
    assert torch.equal(TreeRows(tree, T([1]), LogitsProcessorList(), raw=raw)[2], raw[2])


def test_tree_rows_compute_first_child_chains_only_when_read():
    """Hidden rows become logits through the head in chains: a row, its first child, its first child...,
    then, while the block has room, the children of rows already computed (in node order)."""
    #        root
    #       /    \
    #      0      2
    #      |      |
    #      1      3
    tree = TokenTree(T([10, 11, 12, 13]), T([-1, 0, -1, 2]))
    hidden = torch.arange(5.0)[:, None].repeat(1, 3)  # row r: [r, r, r]
    calls = []

    def head(h):
        calls.append(h[:, 0].tolist())
        return torch.cat([h, -h], dim=-1)  # [k, 6]

    rows = TreeRows(tree, T([1]), LogitsProcessorList(), hidden=hidden, head=head)
    assert rows.rows_computed == 0
    assert rows[0].tolist() == [0, 0, 0, 0, 0, 0]
    assert calls == [[0, 1, 2, 3]]  # root, node 0, node 1; then node 2 fills the block
    assert rows[2][0] == 2 and rows.raw(3)[1] == 3 and rows.head_calls == 1
    assert rows.raw(4)[1] == 4
    assert calls == [[0, 1, 2, 3], [4]]  # node 3: its own call
    assert rows.rows_computed == 5 and rows.head_calls == 2
    calls.clear()
    rows = TreeRows(tree, T([1]), LogitsProcessorList(), hidden=hidden, head=head, block_rows=2)
    rows[3], rows[0], rows[2]
    assert calls == [[3, 4], [0, 1], [2]]  # node 2's chain; root + node 0; node 1
    with pytest.raises(ValueError, match="expected 5 rows"):
        TreeRows(tree, T([1]), LogitsProcessorList(), hidden=hidden[:4], head=head)


def test_lazy_greedy_walk_reads_only_the_rows_it_reaches():
    """Greedy acceptance on TreeRows computes the main path in one head call and nothing else."""
    tree = TokenTree(T([1, 2, 3, 4, 5]), T([-1, 0, 1, -1, 3]))  # two chains: 1-2-3 and 4-5
    best = [1, 2, 9, 0, 0, 0]  # root -> 1 -> 2, then bonus 9
    logits = torch.nn.functional.one_hot(torch.tensor(best), 10).float()
    rows = TreeRows(tree, T([7]), LogitsProcessorList(), hidden=logits, head=lambda h: h)
    acc = greedy_tree_accept(tree, rows)
    assert acc.path.tolist() == [0, 1] and acc.bonus == 9
    assert rows.rows_computed == 4 and rows.head_calls == 1  # rows 0-3, not node 3/4's


# -- non-first branches, cache and hidden state handed to the drafter -------------------------------------------


def test_non_first_branch_is_accepted(m):
    target = m["target"]
    expected = plain(target, REPETITIVE, max_new_tokens=NEW)[0].tolist()
    oracle = Oracle(expected, depth=4)
    a = Using(lambda: oracle)
    stats = assert_parity(target, REPETITIVE, a)
    # beam 0 (wrong) holds nodes 0..3, beam 1 (right) nodes 4..7: every full step takes branch 2
    assert stats.accepted_paths[0] == [4, 5, 6, 7]
    assert all(p == [4, 5, 6, 7][: len(p)] for p in stats.accepted_paths)
    assert stats.tokens_per_target_call == NEW / stats.target_calls and stats.target_calls == 6  # 5 tokens per call
    # what the drafter saw: the target's cache of seq[:-1] and its last hidden state at seq[-2]
    assert oracle.states[0][3] == NEW - 1
    with torch.no_grad():
        for seq, cached, hidden, budget in oracle.states:
            assert cached == seq.shape[0] - 1
            assert budget == REPETITIVE.shape[1] + NEW - seq.shape[0] - 1
            ref = target.model(input_ids=seq[None, :-1]).last_hidden_state[0, -1]
            torch.testing.assert_close(hidden, ref, rtol=1e-4, atol=1e-4)


def test_maxgram_tree_accepts_non_first_branches():
    """Token ``t`` was last followed by made-up words, earlier by what the target says after it:
    Max-Gram's own guess (branch 1) is wrong, the older occurrence (branch 2) is right."""
    target = tm.llama_target()  # its next token depends mostly on the last one
    t = 9

    def make(chain):
        return ids(1, t, *chain, 3, t, 20, 21, 22, 23, 8, t)

    chain = plain(target, ids(1, t), max_new_tokens=4)[0, 2:].tolist()
    for _ in range(5):  # a fixed point: the target continues the prompt with what followed t first
        nxt = plain(target, make(chain), max_new_tokens=4)[0, -4:].tolist()
        if nxt == chain:
            break
        chain = nxt
    assert nxt == chain
    prompt = make(chain)
    a = MaxGramTreeAssistant(branches=4, depth=4)
    stats = assert_parity(target, prompt, a, max_new_tokens=12)
    assert stats.tree_leaves[0] >= 2
    assert stats.accepted_paths[0] and stats.accepted_paths[0][0] != 0, stats.accepted_paths


def test_maxgram_tree_continuations():
    mg = MaxGramTree(branches=4, depth=3)
    seq = T([1, 2, 3, 9, 1, 2, 3, 8, 5, 1, 2, 3])
    # "1 2 3" last occurred followed by "8 5 1", before that by "9 1 2"; shorter suffixes add nothing new
    assert mg.continuations(seq, 3).tolist() == [[8, 5, 1], [9, 1, 2]]
    assert MaxGramTree(branches=1, depth=3).continuations(seq, 3).tolist() == [[8, 5, 1]]
    # a continuation running into the end wraps around the period
    assert mg.continuations(T([4, 5, 4, 5]), 5).tolist()[0] == [4, 5, 4, 5, 4]
    assert mg.continuations(T([7]), 3).shape == (0, 3)
    # beam 0 is Max-Gram's own guess
    g = torch.Generator().manual_seed(0)
    for _ in range(20):
        s = torch.randint(4, 9, (30,), generator=g)
        got = MaxGramTree(depth=5, max_ngram=10).continuations(s, 5)
        assert got[0].tolist() == MaxGram(max_tokens=5, max_ngram=10).candidates(s).tokens.tolist()
        assert len({tuple(b) for b in got.tolist()}) == got.shape[0]
    with pytest.raises(ValueError, match="branches >= 1"):
        MaxGramTree(branches=0)


def test_prune_tree():
    tree = TokenTree(T([10, 2, 12, 13, 14]), T([-1, 0, 1, -1, 3]))  # 10 -> EOS(2) -> 12 ; 13 -> 14
    q = torch.arange(5.0)[:, None].expand(5, 3)
    pruned, pq = prune_tree(tree, q, budget=5, stop_ids=T([2]))
    assert pruned.tokens.tolist() == [10, 2, 13, 14] and pruned.parents.tolist() == [-1, 0, -1, 2]
    assert pq[:, 0].tolist() == [0, 1, 3, 4]
    pruned, _ = prune_tree(tree, None, budget=1, stop_ids=None)
    assert pruned.tokens.tolist() == [10, 13] and pruned.parents.tolist() == [-1, -1]
    assert prune_tree(tree, None, budget=0, stop_ids=None)[0].num_nodes == 0
    assert prune_tree(tree, q, budget=9, stop_ids=None)[0] is tree


def test_tree_rows_compute_at_most_block_rows_per_head_call():
    """A chain of 6 nodes read row by row: rows 0-3 in one call, 4-6 in the next (``block_rows=4``);
    ``block_rows=None`` computes the whole first-child chain at once."""
    tree = TokenTree.chain(T([10, 11, 12, 13, 14, 15]))
    hidden = torch.arange(7.0)[:, None].repeat(1, 3)
    calls = []

    def head(h):
        calls.append(h[:, 0].tolist())
        return torch.cat([h, -h], dim=-1)

    rows = TreeRows(tree, T([1]), LogitsProcessorList(), hidden=hidden, head=head)
    assert [float(rows.raw(r)[0]) for r in range(7)] == [0, 1, 2, 3, 4, 5, 6]
    assert calls == [[0, 1, 2, 3], [4, 5, 6]] and rows.head_calls == 2
    calls.clear()
    whole = TreeRows(tree, T([1]), LogitsProcessorList(), hidden=hidden, head=head, block_rows=None)
    whole[0]
    assert calls == [[0, 1, 2, 3, 4, 5, 6]] and whole.rows_computed == 7
    with pytest.raises(ValueError, match="block_rows"):
        TreeRows(tree, T([1]), LogitsProcessorList(), hidden=hidden, head=head, block_rows=0)


class OnePath(TreeDrafter):
    """Proposes the expected continuation as a one-path tree (``depth`` nodes), or nothing every third step: what a
    chain drafter, ReDrafter at beam width 1 or a cut CAPE tree hands the loop."""

    def __init__(self, expected: list[int], depth: int = 3):
        self.expected, self.depth, self.steps = expected, depth, 0

    def draft_tree(self, seq, state):
        self.steps += 1
        right = self.expected[seq.shape[0] : seq.shape[0] + self.depth]
        if not right or self.steps % 3 == 0:
            return TokenTree(seq.new_zeros(0), seq.new_zeros(0)), None
        return TokenTree.chain(T(right)), None


def test_one_path_trees_are_verified_as_chains(m, monkeypatch):
    """A tree of one path (an empty one included) is verified with plain causal attention (``chain=True``, no
    tree mask), whatever the drafter's ``linear``; a branched tree with the tree mask; outputs = plain's."""
    import hf_cascade.core.loop as loop

    seen, real = [], loop.row_inputs

    def inputs(*a, **kw):
        made = real(*a, **kw)
        seen.append((a[2].num_nodes, "attention_mask" not in made))  # a chain: the model's own causal mask
        return made

    monkeypatch.setattr(loop, "row_inputs", inputs)
    target = m["target"]
    expected = plain(target, REPETITIVE, max_new_tokens=NEW)[0].tolist()
    assert_parity(target, REPETITIVE, Using(lambda: OnePath(expected)))
    assert seen and all(chain for _, chain in seen) and {n for n, _ in seen} >= {0, 3}
    seen.clear()
    assert_parity(target, REPETITIVE, Using(lambda: Oracle(expected)))
    assert any(n and not chain for n, chain in seen)  # two beams: the tree mask
