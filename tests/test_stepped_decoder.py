"""drafters.stepped: a Llama decoder's cached forward stepped through its modules gives the decoder's hidden states
and cache bit for bit (one and several queries, rollbacks, positions drafted again), and runs only while nothing
hooks or wraps the decoder."""

import pytest
import torch
from transformers import DynamicCache

from hf_cascade.bench import tiny
from hf_cascade.compat import cache_kwargs
from hf_cascade.drafters import stepped as stepped_module
from hf_cascade.drafters.static_forward import keep_draft_prefix
from hf_cascade.drafters.stepped import SteppedDecoder

#: the installed transformers' Llama forward is the one the stepped forward was written against (5.x)
known = pytest.mark.skipif(
    not stepped_module._KNOWN,
    reason="this transformers' LlamaModel.forward has another "
    "signature: the decoder runs (test_another_signature_runs_the_decoder)",
)


@known
@pytest.mark.parametrize("attention", ["sdpa", "eager"])
@pytest.mark.parametrize("inference", [True, False])
def test_stepped_equals_decoder(attention, inference):
    torch.manual_seed(0)
    drafter = tiny.truncated_copy(tiny.llama_target(), 2)
    drafter.config._attn_implementation = attention
    decoder = drafter.get_decoder()
    stepped = SteppedDecoder.of(decoder)
    assert stepped is not None and stepped.usable()
    ids = torch.randint(0, 96, (1, 160))
    with torch.inference_mode() if inference else torch.no_grad():
        full, mine, pos = DynamicCache(), DynamicCache(), 0
        for _ in range(4):
            for t in (9, 1, 1, 3, 1, 5, 1, 1, 2, 1, 1, 1):
                x = ids[:, pos : pos + t]
                pos += t
                want = decoder(input_ids=x, **cache_kwargs(decoder, full)).last_hidden_state
                assert torch.equal(stepped(x, mine), want)
                for a, b in zip(full.layers, mine.layers):
                    assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)
            pos -= 7  # roll back: the same positions drafted again
            keep_draft_prefix(None, full, pos)
            keep_draft_prefix(None, mine, pos)


@known
def test_stepped_only_where_nothing_observes_the_decoder():
    drafter = tiny.truncated_copy(tiny.llama_target(), 1)
    decoder = drafter.get_decoder()
    stepped = SteppedDecoder.of(decoder)
    handle = decoder.register_forward_pre_hook(lambda *_: None)
    assert not stepped.usable()
    handle.remove()
    assert stepped.usable()
    decoder.forward = decoder.forward  # an instance forward (as accelerate's hooks install)
    assert not stepped.usable()
    del decoder.forward
    decoder.train()
    assert not stepped.usable()
    assert SteppedDecoder.of(tiny.echo_glide(tiny.llama_target()).get_decoder()) is None  # not a LlamaModel


def test_another_signature_runs_the_decoder(monkeypatch):
    """Where the installed ``LlamaModel.forward`` is not the one written against (transformers 4.57's takes
    ``past_key_values`` and ``cache_position``), there is no stepped forward: the drafter runs the decoder."""

    class Older:
        def forward(
            self,
            input_ids=None,
            attention_mask=None,
            position_ids=None,
            past_key_values=None,
            inputs_embeds=None,
            cache_position=None,
            use_cache=None,
            **kwargs,
        ):
            pass

    monkeypatch.setattr(stepped_module, "LlamaModel", Older)
    assert not stepped_module._known()
    monkeypatch.setattr(stepped_module, "_KNOWN", False)
    assert SteppedDecoder.of(tiny.truncated_copy(tiny.llama_target(), 1).get_decoder()) is None
