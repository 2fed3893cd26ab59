"""The transformers releases hf_cascade supports: the cache's renamed keyword (5.24) resolved per model, and the
hook's check of the private entry points it wraps (a moved one fails at import with one clear message)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
import transformers
from packaging.version import Version
from transformers.generation.utils import GenerationMixin

from hf_cascade import hook
from hf_cascade.compat import CACHE, cache_keyword, cache_kwargs, given_cache, output_cache
from tests import tiny_models as tm
from tests.tiny_models import single_thread  # noqa: F401  (autouse fixture)

ROOT = Path(__file__).resolve().parent.parent


def test_the_cache_keyword_is_the_installed_releases():
    target = tm.llama_target()
    expected = "cache" if Version(transformers.__version__) >= Version("5.24") else "past_key_values"
    assert CACHE == expected and cache_keyword(target) == CACHE
    out = target(torch.tensor([[1, 2, 3]]), **cache_kwargs(target, None))
    assert output_cache(out) is not None and output_cache(out).get_seq_length() == 3
    assert given_cache({CACHE: "x"}) == "x" and given_cache({"attention_mask": 1}) is None


def test_a_model_declaring_the_old_keyword_gets_it():
    """Remote code written before 5.24 declares ``past_key_values``: it is called with that name."""

    class Old(torch.nn.Module):
        def forward(self, input_ids=None, past_key_values=None, use_cache=None):
            return past_key_values

    class New(torch.nn.Module):
        def forward(self, input_ids=None, cache=None, use_cache=None):
            return cache

    assert cache_keyword(Old()) == "past_key_values" and Old()(**cache_kwargs(Old(), "c")) == "c"
    assert cache_keyword(New()) == "cache" and New()(**cache_kwargs(New(), "c")) == "c"


@pytest.mark.parametrize("name", ["cache", "past_key_values"])
def test_our_heads_take_either_name(name):
    """The shipped heads are remote code for every supported release: generate passes ``cache`` from 5.24 on and
    ``past_key_values`` before; both reach the head's own cache, returned under the installed release's name."""
    from transformers import DynamicCache

    from tests.test_drafter_head import make_drafter
    from tests.test_glide_decode import echo_glide

    x = tm.ids(1, 4, 5, 6, 7, 8)
    target = tm.llama_target()
    glide = echo_glide(target)
    kv = output_cache(target(x, use_cache=True))
    for head, extra in ((make_drafter(), {"full_vocab": False}), (glide, {"target_key_values": kv})):
        full = head(x, **extra).logits
        cache = DynamicCache()
        first = head(x[:, :4], use_cache=True, **{name: cache}, **extra)
        assert output_cache(first) is cache and cache.get_seq_length() == 4
        rest = head(x[:, 4:], use_cache=True, **{name: cache}, **extra)
        torch.testing.assert_close(torch.cat([first.logits, rest.logits], dim=1), full, rtol=1e-5, atol=1e-5)


def test_entry_points_of_the_installed_release_have_the_expected_shape():
    hook.check_entry_points()
    assert getattr(GenerationMixin._assisted_decoding, hook._MARK, None) is not None  # installed


@pytest.mark.parametrize("case", ["gone", "renamed parameter"])
def test_a_moved_entry_point_fails_with_one_clear_message(monkeypatch, case):
    if case == "gone":
        monkeypatch.delattr(GenerationMixin, "_get_candidate_generator")
    else:

        def _assisted_decoding(
            self, input_ids, logits_processor, stopping_criteria, generation_config, draft_model=None
        ):
            raise AssertionError("never called")

        monkeypatch.setattr(GenerationMixin, "_assisted_decoding", _assisted_decoding)
    with pytest.raises(ImportError) as err:
        hook.check_entry_points()
    message = str(err.value)
    assert hook.SUPPORTED in message and transformers.__version__ in message
    assert (
        "_get_candidate_generator is gone" if case == "gone" else "_assisted_decoding no longer takes assistant_model"
    ) in message


def _run(script: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_import_fails_clearly_and_wraps_nothing_where_an_entry_point_moved():
    """In a fresh interpreter, as a user with a future release would see it."""
    res = _run(
        "from transformers.generation.utils import GenerationMixin as G\n"
        "def _assisted_decoding(self, input_ids, logits_processor, stopping_criteria, generation_config): pass\n"
        "G._assisted_decoding = _assisted_decoding\n"
        "original = G.generate\n"
        "try:\n"
        "    import hf_cascade\n"
        "except ImportError as e:\n"
        "    assert G.generate is original, 'wrapped before failing'\n"
        "    print('IMPORT-ERROR', e)\n"
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert "IMPORT-ERROR hf_cascade supports transformers>=4.57" in res.stdout
    assert "_assisted_decoding no longer takes assistant_model" in res.stdout


def test_a_newer_release_with_the_same_entry_points_keeps_working():
    """A release newer than the newest tested one, whose entry points still have their shapes: imports and decodes
    (greedy output identical to plain)."""
    res = _run(
        "import transformers\n"
        "transformers.__version__ = '5.99.0'\n"
        "import hf_cascade\n"
        "from hf_cascade import CascadeAssistant, MaxGram\n"
        "from tests import tiny_models as tm\n"
        "target = tm.llama_target()\n"
        "ids = tm.ids(1, 5, 6, 7, 5, 6, 7, 5)\n"
        "plain = target.generate(ids, do_sample=False, max_new_tokens=12)\n"
        "ours = target.generate(ids, assistant_model=CascadeAssistant([MaxGram()]),"
        " do_sample=False, max_new_tokens=12)\n"
        "assert ours.tolist() == plain.tolist(), (ours, plain)\n"
        "print('OK')\n"
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.strip().endswith("OK")


def test_no_call_of_ours_goes_through_the_deprecated_cache_name():
    """transformers >= 5.24 warns once when ``past_key_values`` is passed or read; a decode of every kind of
    drafter (Max-Gram, a neural drafter, GLIDE) must not trigger it."""
    res = _run(
        "import logging, warnings\n"
        "warnings.simplefilter('error', FutureWarning)\n"
        "import transformers\n"
        "seen = []\n"
        "class Catch(logging.Handler):\n"
        "    def emit(self, record): seen.append(record.getMessage())\n"
        "logging.getLogger('transformers').addHandler(Catch())\n"
        "import hf_cascade\n"
        "from hf_cascade import CascadeAssistant, GlideAssistant, MaxGram\n"
        "from tests import tiny_models as tm\n"
        "from tests.test_glide_decode import echo_glide\n"
        "target = tm.llama_target()\n"
        "ids = tm.ids(1, 5, 6, 7, 5, 6, 7, 5)\n"
        "plain = target.generate(ids, do_sample=False, max_new_tokens=10)\n"
        "for a in (CascadeAssistant([MaxGram()]), CascadeAssistant([tm.noisy_copy(target), MaxGram()]),\n"
        "          GlideAssistant(echo_glide(target))):\n"
        "    out = target.generate(ids, assistant_model=a, do_sample=False, max_new_tokens=10)\n"
        "    assert out.tolist() == plain.tolist()\n"
        "bad = [m for m in seen if 'deprecated' in m]\n"
        "assert not bad, bad\n"
        "print('OK')\n"
    )
    assert res.returncode == 0, res.stderr[-3000:]
