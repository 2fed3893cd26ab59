"""The answer memory (:mod:`hf_cascade.drafters.memory`, ``Policy(memory=...)``): lookups and eviction on golden
token lists, Max-Gram's choice between its own match and the memory's, and on tiny targets: greedy output identical
with and without memory over calls where the memory drafts, a bounded memory, no state shared between two assistants,
``forget()``, and one assistant called from several threads. Exact sampling with memory is the contract's
(``maxgram_memory`` in :mod:`tests.contract_registry`)."""

from __future__ import annotations

import sys
import threading

import pytest
import torch

from hf_cascade import (
    CascadeAssistant,
    DynamicWindowAssistant,
    DynamicWindowSettings,
    GlideAssistant,
    MaxGram,
    ReDrafterAssistant,
    ReDrafterSettings,
)
from hf_cascade.core.payoff import DraftPolicy
from hf_cascade.drafters.memory import AnswerMemory, memory_bucket
from hf_cascade.options import Policy
from tests import tiny_models as tm
from tests.contract_registry import base_kit, fresh_kit
from tests.tiny_models import single_thread  # noqa: F401  (autouse fixture)

# -- the memory on token lists -------------------------------------------------------------------------


def test_recall_takes_the_longest_match_most_recent_first():
    memory = AnswerMemory(max_tokens=100, key=2)
    memory.add([5, 6, 7, 8, 9])
    memory.add([1, 6, 7, 3, 4])
    assert memory.recall([0, 6, 7], max_ngram=10, k=2) == ([3, 4], 2)  # a tie: the most recent answer
    assert memory.recall([5, 6, 7], max_ngram=10, k=5) == ([8, 9], 3)  # longer in the older: it wins
    assert memory.recall([5, 6, 7], max_ngram=2, k=1) == ([3], 2)  # capped: a tie again
    assert memory.recall([8, 9], max_ngram=10, k=3) == ([], 0)  # nothing follows an answer's end
    assert memory.recall([7], max_ngram=10, k=3) == ([], 0)  # shorter than the key
    m, found = memory.occurrences([0, 6, 7], max_ngram=10, max_matches=4)
    assert m == 2 and [end for _, end in found] == [2, 2] and found[0][0] == [1, 6, 7, 3, 4]


def test_eviction_keeps_the_limit_and_the_newest_answers():
    memory = AnswerMemory(max_tokens=10, key=2)
    memory.add([1, 2, 3, 4])
    memory.add([5, 6, 7, 8])
    memory.add([9, 10, 11, 12])  # 12 tokens: the oldest answer goes
    assert (len(memory), memory.answers, memory.entries) == (8, 2, 4)
    assert memory.recall([1, 2], 10, 2) == ([], 0)
    assert memory.recall([9, 10], 10, 2) == ([11, 12], 2)
    memory.add(list(range(20, 40)))  # longer than the limit: its last 10 tokens, alone
    assert (len(memory), memory.answers, memory.entries) == (10, 1, 8)
    assert memory.recall([30, 31], 10, 3) == ([32, 33, 34], 2) and memory.recall([20, 21], 10, 1) == ([], 0)
    memory.add([1, 2])  # nothing follows its only context: not kept
    assert memory.answers == 1
    memory.forget()
    assert (len(memory), memory.answers, memory.entries) == (0, 0, 0)
    assert memory.recall([30, 31], 10, 3) == ([], 0)


def test_bounded_over_10k_fills():
    """10k answers of 5-60 tokens (synthetic fills: 10k generate() calls are too slow for the suite) into a
    2000-token memory: never above the limit, one index entry per kept context, lookups still find the newest."""
    g = torch.Generator().manual_seed(0)
    memory = AnswerMemory(max_tokens=2000, key=2)
    for _ in range(10_000):
        n = int(torch.randint(5, 61, (1,), generator=g))
        answer = torch.randint(0, 50, (n,), generator=g).tolist()
        memory.add(answer)
        assert len(memory) <= 2000
    assert memory.entries == len(memory) - 2 * memory.answers  # (each answer of n tokens: n - key entries)
    assert memory.recall(answer[:-1], 10, 1) == ([answer[-1]], min(10, len(answer) - 1))


def test_memory_rejects_bad_settings():
    with pytest.raises(ValueError, match="max_tokens"):
        AnswerMemory(max_tokens=0)
    with pytest.raises(ValueError, match="memory"):
        Policy(memory=-1)
    with pytest.raises(ValueError, match="memory"):
        Policy(memory=True)


def test_maxgram_takes_the_memory_when_its_match_is_longer():
    policy = DraftPolicy.lookahead(MaxGram(adaptive=False))
    memory = AnswerMemory(100)
    memory.add([7, 8, 9, 10, 11, 12])
    seq = torch.tensor([9, 20, 7, 8, 9])  # the sequence's own match: "9" (1 token); memory's: 3
    prop = MaxGram(adaptive=False).propose(seq, 10, policy, memory=memory)
    assert prop.host == [10, 11, 12] and prop.bucket == memory_bucket(3)
    assert MaxGram(adaptive=False).propose(seq, 10, policy).host[:2] == [20, 7]
    for _ in range(20):  # the memory's drafts keep being rejected: the sequence's
        policy.observe(memory_bucket(3), 3, 0)
    assert MaxGram(adaptive=False).propose(seq, 10, policy, memory=memory).host[:2] == [20, 7]


# -- decoding with memory on tiny targets --------------------------------------------------------------

NEW = 30


@pytest.fixture(scope="module")
def target():
    return tm.gemma3_target()


@pytest.fixture(scope="module")
def prompts():
    return tm.random_prompts(8, seed=3)


def test_greedy_identical_with_and_without_memory(target, prompts):
    """Two passes over the prompts: outputs equal plain ``generate``'s; the memory drafted (accepted and
    rejected tokens) and saved target calls."""
    with_memory = CascadeAssistant([MaxGram()], policy=Policy(memory=5000))
    without = CascadeAssistant([MaxGram()])
    calls = {"with": 0, "without": 0}
    proposed = accepted = 0
    for prompt in prompts + prompts:
        plain = target.generate(prompt, max_new_tokens=NEW, do_sample=False).tolist()
        for name, assistant in (("with", with_memory), ("without", without)):
            assert (
                target.generate(prompt, max_new_tokens=NEW, do_sample=False, assistant_model=assistant).tolist()
                == plain
            ), name
            calls[name] += assistant.last_stats.target_calls
        level = with_memory.last_stats.levels[-1]
        assert level.name == "memory"
        proposed, accepted = proposed + level.tokens_proposed, accepted + level.tokens_accepted
    assert 0 < accepted < proposed  # memory drafts reached the target, some rejected
    assert calls["with"] < calls["without"]
    assert [lv.name for lv in without.last_stats.levels] == ["maxgram"] and without.memory is None


LOOKUP_USERS = {
    "glide": lambda kit, policy: GlideAssistant(kit.glide, policy=policy),
    "redrafter": lambda kit, policy: ReDrafterAssistant(
        kit.head, settings=ReDrafterSettings(beam_width=4, beam_length=4), policy=policy
    ),
    "hsddw": lambda kit, policy: DynamicWindowAssistant(
        kit.drafter, kit.big, policy=policy, settings=DynamicWindowSettings(max_window=4, tau_init=2.0, tau2_init=2.0)
    ),
}


@pytest.mark.parametrize("name", list(LOOKUP_USERS))
def test_lookup_users_draft_from_memory_losslessly(name, prompts):
    """GLIDE's and ReDrafter's lookup branch and HSDDW's Max-Gram lookup draft from the memory too: outputs equal
    plain ``generate``'s, fewer target calls than without memory."""
    kit = fresh_kit("gemma3", base_kit("gemma3").target)
    target = kit.target
    with_memory, without = LOOKUP_USERS[name](kit, Policy(memory=5000)), LOOKUP_USERS[name](kit, Policy())
    calls = {"with": 0, "without": 0}
    for prompt in prompts[:4] + prompts[:4]:
        plain = target.generate(prompt, max_new_tokens=NEW, do_sample=False).tolist()
        for key, assistant in (("with", with_memory), ("without", without)):
            assert (
                target.generate(prompt, max_new_tokens=NEW, do_sample=False, assistant_model=assistant).tolist()
                == plain
            ), key
            calls[key] += assistant.last_stats.target_calls
    assert calls["with"] < calls["without"], calls


def test_batch_rows_are_remembered_without_padding(target):
    assistant = CascadeAssistant([MaxGram()], policy=Policy(memory=5000))
    rows = [[1, 5, 6, 5, 6, 5], [1, 9, 12]]
    width = max(map(len, rows))
    input_ids = torch.tensor([[tm.PAD] * (width - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    out = target.generate(input_ids, attention_mask=mask, max_new_tokens=12, do_sample=False, assistant_model=assistant)
    answers = [a for _, a in assistant.memory._answers]
    expected = []
    for row in out[:, width:].tolist():
        expected.append(row[: row.index(tm.EOS) + 1] if tm.EOS in row else row)
    assert answers == [a for a in expected if len(a) > assistant.memory.key]


def test_no_state_leaks_between_assistants_and_forget_empties(target, prompts):
    """What one assistant remembers, another does not see; after ``forget()`` an assistant drafts as a fresh one
    (same statistics)."""
    a = CascadeAssistant([MaxGram()], policy=Policy(memory=5000))
    b = CascadeAssistant([MaxGram()], policy=Policy(memory=5000))
    for prompt in prompts[:4]:
        target.generate(prompt, max_new_tokens=NEW, do_sample=False, assistant_model=a)
    assert a.memory.answers > 0 and b.memory.answers == 0 and a.memory is not b.memory

    def stats(assistant):
        target.generate(prompts[0], max_new_tokens=NEW, do_sample=False, assistant_model=assistant)
        s = assistant.last_stats
        return (
            s.target_calls,
            s.accepted_per_call,
            [(lv.name, lv.tokens_proposed, lv.tokens_accepted) for lv in s.levels],
        )

    fresh = stats(CascadeAssistant([MaxGram()], policy=Policy(memory=5000)))
    assert stats(b) == fresh  # b saw none of a's answers
    remembered = stats(a)
    assert remembered != fresh  # a drafts from its memory
    a.forget()
    assert (len(a.memory), a.memory.answers) == (0, 0)
    assert stats(a) == fresh


def test_one_assistant_called_from_several_threads(target, prompts):
    """A pipeline's threads share one assistant: each call gives its plain output, the memory stays consistent."""
    assistant = CascadeAssistant([MaxGram()], policy=Policy(memory=300))
    plain = {i: target.generate(p, max_new_tokens=NEW, do_sample=False).tolist() for i, p in enumerate(prompts)}
    got, errors = {}, []

    def work(i):
        try:
            for _ in range(2):
                got[i] = target.generate(
                    prompts[i], max_new_tokens=NEW, do_sample=False, assistant_model=assistant
                ).tolist()
                assert got[i] == plain[i], i
        except Exception as exc:  # reported below: a thread's assert does not fail the test
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    memory = assistant.memory
    assert len(memory) <= 300 and memory.entries == len(memory) - memory.key * memory.answers


def test_memory_reads_and_writes_are_locked():
    """Threads adding (evicting) and recalling at once: without the lock a lookup walks an index being changed."""
    memory = AnswerMemory(max_tokens=200, key=2)
    answer = list(range(40)) * 2
    errors = []
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)

    def add():
        try:
            for i in range(300):
                memory.add([t + i % 3 for t in answer])
        except Exception as exc:
            errors.append(exc)

    def recall():
        try:
            for _ in range(3000):
                memory.occurrences([5, 6, 7, 8], max_ngram=10, max_matches=8)
        except Exception as exc:
            errors.append(exc)

    try:
        threads = [threading.Thread(target=f) for f in (add, add, recall, recall, recall)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(before)
    assert not errors, errors[:3]
    assert len(memory) <= 200 and memory.entries == len(memory) - 2 * memory.answers
