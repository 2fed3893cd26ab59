"""The README's python examples run as written (issue 54): every ```python block of README.md, verbatim, in a fresh
interpreter, offline, from the repository's root, with the default Hub cache holding a saved copy of the real target
as ``google/gemma-3-270m`` (:func:`tests.conftest.card_hub`). Every ``generate`` call the block makes with an
assistant (directly or through a pipeline) is recorded and, after the block, run again without the assistant: the
tokens must be the same (greedy, lossless).

A block that needs the network (and what only its user has: an upload of a head to a repo of their own) says so
in its first line, ``# needs the network``, and names that repo ``<your-org>/<folder>``. Such a block is checked
for its form (it compiles, imports what hf_cascade has, names an existing folder) and then run the same way with
``<your-org>/<folder>`` replaced by the repo id under which the local cache holds that folder, and a login (the
``HF_TOKEN`` of the environment) for its ``token=True``."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

import hf_cascade
from tests.hub_cache import CARDS, TARGET, hub_env, other_repo

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
NETWORK = "# needs the network"
PLACEHOLDER = re.compile(r"<your-org>/([\w.-]+)")


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), re.S)


def needs_network(block: str) -> bool:
    return block.startswith(NETWORK)


def _strings(block: str) -> list[str]:
    return [n.value for n in ast.walk(ast.parse(block)) if isinstance(n, ast.Constant) and isinstance(n.value, str)]


#: recorder run before a block: every generate() call with an assistant, kept with its inputs and output
PRELUDE = """
import functools as _functools
import transformers.generation.utils as _generation
_CALLS = []
_plain_generate = _generation.GenerationMixin.generate


@_functools.wraps(_plain_generate)
def _recording_generate(self, *args, **kwargs):
    out = _plain_generate(self, *args, **kwargs)
    if kwargs.get("assistant_model") is not None:
        _CALLS.append((self, args, dict(kwargs), out))
    return out


_generation.GenerationMixin.generate = _recording_generate
"""

#: run after a block: each recorded call again without its assistant (once per distinct call), the same tokens
EPILOGUE = """
import sys as _sys
import hf_cascade as _hf_cascade
assert _CALLS, "the block generated nothing with an assistant"
assert not [m for m in _sys.modules if m.startswith("transformers_modules")], "remote code ran"
_PLAIN = {}
for _model, _args, _kwargs, _out in _CALLS:
    _assistant = _kwargs["assistant_model"]
    assert isinstance(_assistant, _hf_cascade.Assistant), type(_assistant)
    _kw = {k: v for k, v in _kwargs.items() if k not in ("assistant_model", "assistant_tokenizer", "streamer")}
    _key = repr((id(_model), [a.tolist() if hasattr(a, "tolist") else a for a in _args],
                 sorted((k, v.tolist() if hasattr(v, "tolist") else v) for k, v in _kw.items())))
    if _key not in _PLAIN:
        _PLAIN[_key] = _plain_generate(_model, *_args, **_kw)
    _seq = [getattr(o, "sequences", o) for o in (_out, _PLAIN[_key])]
    assert _seq[0].tolist() == _seq[1].tolist(), ("output differs from plain greedy decoding", type(_assistant))
    print("README-CALL", type(_assistant).__name__, _assistant.last_stats.target_calls, _seq[0].shape[1])
print("README-OK", len(_CALLS))
"""


def test_readme_blocks_are_well_formed():
    """Every block compiles and imports only what hf_cascade has; the folders it names exist; the only Hub ids are
    the real target's and, in blocks marked as needing the network, ``<your-org>/...`` (nothing is published as
    ``hf-cascade/...``)."""
    blocks = python_blocks()
    assert len(blocks) >= 3 and not needs_network(blocks[0])  # the first example runs on a fresh clone
    assert any(needs_network(b) for b in blocks)  # the Hub form is shown, marked
    assert "hf-cascade/" not in README.read_text()
    folders = {d.name for d in CARDS.iterdir() if d.is_dir()}
    for block in blocks:
        tree = ast.parse(block)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module == "hf_cascade":
                missing = [a.name for a in node.names if not hasattr(hf_cascade, a.name)]
                assert not missing, f"hf_cascade has no {missing}"
        for text in _strings(block):
            if re.fullmatch(r"[\w.-]+/[\w.<>-]+", text) and not text.startswith("model_cards/"):
                assert text == TARGET or (needs_network(block) and PLACEHOLDER.fullmatch(text)), text
        named = re.findall(r'shipped\("([^"]+)"\)', block) + re.findall(r"model_cards/([\w.-]+)", block)
        named += PLACEHOLDER.findall(block)
        assert set(named) <= folders, set(named) - folders
        if needs_network(block):
            assert PLACEHOLDER.search(block), "a block that needs the network names the user's repo as <your-org>/..."
        else:
            assert "<your-org>" not in block


def test_shipped_names_the_folders_and_fails_clearly(tmp_path, monkeypatch):
    assert hf_cascade.shipped("gemma-3-270m-glide-xs") == str(CARDS / "gemma-3-270m-glide-xs")
    with pytest.raises(FileNotFoundError, match="the shipped ones: .*gemma-3-270m-glide-xs"):
        hf_cascade.shipped("gemma-3-270m-glide-xxl")
    from hf_cascade import shipped_folders as shipped_module

    monkeypatch.setattr(shipped_module, "MODEL_CARDS", tmp_path / "site-packages" / "model_cards")  # as in a wheel
    with pytest.raises(
        FileNotFoundError,
        match=r"(?s)a wheel does not carry them.*pip install -e \..*hf upload "
        r"<your-org>/gemma-3-270m-glide-xs",
    ):
        hf_cascade.shipped("gemma-3-270m-glide-xs")


@pytest.mark.real_model
@pytest.mark.parametrize("index", range(len(python_blocks())))
def test_readme_block_runs_as_written(index, card_hub, tmp_path):
    block = python_blocks()[index]
    env = hub_env(card_hub, tmp_path)
    if needs_network(block):
        block = PLACEHOLDER.sub(lambda m: other_repo(m.group(1)), block)
        env["HF_TOKEN"] = "hf_" + "x" * 34  # a login, for token=True (offline: never sent)
    res = subprocess.run(
        [sys.executable, "-c", PRELUDE + block + EPILOGUE],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-4000:]
    calls = [line.split() for line in res.stdout.splitlines() if line.startswith("README-CALL")]
    assert calls and res.stdout.rstrip().endswith(f"README-OK {len(calls)}"), res.stdout
    printed = [line for line in res.stdout.splitlines() if not line.startswith("README-")]
    assert "".join(printed).strip(), "the block printed no text"
