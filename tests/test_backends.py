"""The verification backend switch (hf_cascade/backends): the CPU kernels are engaged only for float32
targets on CPU (automatic), by one argument (``cpu_kernels=``) and one environment variable
(``HF_CASCADE_CPU_KERNELS``); the core, the strategies and training never import them otherwise;
``hf_cascade.cpu_kernels(model)`` for plain decoding."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import hf_cascade
from hf_cascade import CascadeAssistant, MaxGram, backends
from tests import tiny_models as tm
from tests.test_layers import PACKAGE, ROOT, imports, module_name
from tests.tiny_models import single_thread  # noqa: F401  (autouse fixture)

CPU = "hf_cascade.backends.cpu"

# -- static: who may import the CPU backend -------------------------------------------------------

#: packages that must not import the CPU backend at all (they go through the switch)
NEVER = ("core", "cascade", "glide", "hsddw", "redrafter", "drafters", "heads", "training")
#: modules that must not import it either
NEVER_MODULES = ("assistant.py", "candidate.py", "hook.py", "processors.py", "models.py", "data.py")


def _cpu_imports(path: Path) -> list[tuple[int, bool]]:
    """``(line, at module level)`` of every import of the CPU backend in ``path``."""
    return [(line, top) for module, line, top in imports(path) if module == CPU or module.startswith(CPU + ".")]


def test_static_imports_of_the_cpu_backend():
    """The core, the strategies and training never import ``hf_cascade.backends.cpu``; the rest of the
    package only inside functions (lazily, where the switch or the user engages it)."""
    files = [p for p in PACKAGE.rglob("*.py") if not module_name(p).startswith(CPU)]
    assert len(files) > 30
    for path in files:
        rel = path.relative_to(PACKAGE)
        found = _cpu_imports(path)
        if rel.parts[0] in NEVER or str(rel) in NEVER_MODULES:
            assert not found, f"{rel} imports {CPU} (lines {[ln for ln, _ in found]}): go through hf_cascade.backends"
        else:
            assert not [ln for ln, top in found if top], f"{rel} imports {CPU} at import time"


def test_static_check_sees_relative_imports():
    """The checker itself: relative and absolute spellings, module level or in a function."""
    demo = PACKAGE / "demo.py"
    assert _cpu_imports(demo) and not any(top for _, top in _cpu_imports(demo))
    assert [top for _, top in _cpu_imports(PACKAGE / "bench" / "methods.py")] == [False]


# -- in a fresh process: what generate() imports ----------------------------------------------------

_SCRIPT = r"""
import json, os, sys
import torch
import hf_cascade
from hf_cascade import CascadeAssistant, MaxGram
from hf_cascade.maxgram_tree import MaxGramTreeAssistant
from tests import tiny_models as tm

sessions = []
real = hf_cascade.assistant.verification_session

def recording(model, cpu_kernels=None, kind=None):
    cm = real(model, cpu_kernels, kind)

    class Recorder:
        def __enter__(self):
            session = cm.__enter__()
            sessions.append(session.backend)
            return session

        def __exit__(self, *exc):
            return cm.__exit__(*exc)

    return Recorder()

hf_cascade.assistant.verification_session = recording
torch.set_num_threads(1)
target = tm.llama_target()
if sys.argv[1] == "bf16":
    target = target.to(torch.bfloat16)
prompt = tm.random_prompts(1, seed=2)[0]
same = []
ref = target.generate(prompt, max_new_tokens=16, do_sample=False)
for a in (CascadeAssistant([MaxGram()]), MaxGramTreeAssistant()):
    out = target.generate(prompt, max_new_tokens=16, do_sample=False, assistant_model=a)
    same.append(bool(torch.equal(out, ref)))
print(json.dumps({"sessions": sessions, "same": same,
                  "cpu_modules": sorted(m for m in sys.modules if m.startswith("hf_cascade.backends.cpu"))}))
"""


def _fresh(*args: str, env: dict | None = None, script: str = _SCRIPT) -> dict:
    environ = {k: v for k, v in os.environ.items() if k != "HF_CASCADE_CPU_KERNELS"}
    environ.update(env or {}, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    res = subprocess.run(
        [sys.executable, "-c", script, *args], cwd=ROOT, env=environ, capture_output=True, text=True, timeout=600
    )
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


def test_bf16_target_never_loads_the_cpu_backend():
    got = _fresh("bf16")
    assert got["sessions"] == ["model", "model"]
    assert got["cpu_modules"] == []


def test_float32_cpu_target_engages_it_by_default():
    got = _fresh("fp32")
    assert got["sessions"] == ["cpu", "cpu"]
    assert CPU in got["cpu_modules"] and f"{CPU}.verify_linear" in got["cpu_modules"]
    assert got["same"] == [True, True]


def test_environment_variable_turns_it_off():
    got = _fresh("fp32", env={"HF_CASCADE_CPU_KERNELS": "0"})
    assert got["sessions"] == ["model", "model"]
    assert got["cpu_modules"] == []
    assert got["same"] == [True, True]


def test_importing_the_package_loads_no_cpu_backend():
    """Every module of the package (the backend's own excepted) imported: still no CPU backend."""
    script = r"""
import importlib, json, sys
from pathlib import Path
import hf_cascade
root = Path(hf_cascade.__file__).parent
names = sorted(".".join(("hf_cascade",) + p.relative_to(root).with_suffix("").parts) for p in root.rglob("*.py"))
failed = []
for name in names:
    name = name.removesuffix(".__init__")
    if name.startswith("hf_cascade.backends.cpu"):         # walk_packages would import it to list it
        continue
    try:
        importlib.import_module(name)
    except ImportError as err:                     # an optional dependency missing here
        if (getattr(err, "name", "") or "").startswith("hf_cascade"):
            raise
        failed.append([name, err.name or str(err)])
print(json.dumps({"failed": failed,
                  "cpu_modules": sorted(m for m in sys.modules if m.startswith("hf_cascade.backends.cpu"))}))
"""
    got = _fresh(script=script)
    assert got["cpu_modules"] == []
    # a module may be left out only for a missing optional package, never for one of the core's own
    assert {missing for _, missing in got["failed"]} <= OPTIONAL_PACKAGES, got["failed"]
    failed = [name for name, _ in got["failed"]]
    for package in ("core", "cascade", "glide", "training", "hsddw", "redrafter"):
        assert not any(name == f"hf_cascade.{package}" or name.startswith(f"hf_cascade.{package}.") for name in failed)


#: packages an hf_cascade module may need that a plain install does not bring (extras, peers)
OPTIONAL_PACKAGES = {"arctic_inference", "economize", "datasets", "matplotlib", "gguf"}


# -- the switch, in process ---------------------------------------------------------------------------


def test_switch_rules(monkeypatch):
    fp32, bf16 = tm.llama_target(), tm.llama_target().to(torch.bfloat16)
    monkeypatch.delenv(backends.ENV, raising=False)
    assert backends.wants_cpu_kernels(fp32, None) and not backends.wants_cpu_kernels(bf16, None)
    assert backends.wants_cpu_kernels(fp32, True) and not backends.wants_cpu_kernels(fp32, False)
    assert not backends.wants_cpu_kernels(bf16, False)
    with pytest.raises(ValueError, match="float32"):
        backends.wants_cpu_kernels(bf16, True)
    monkeypatch.setenv(backends.ENV, "0")
    assert not backends.wants_cpu_kernels(fp32, None) and backends.wants_cpu_kernels(fp32, True)
    monkeypatch.setenv(backends.ENV, "1")
    assert backends.wants_cpu_kernels(fp32, None) and not backends.wants_cpu_kernels(fp32, False)
    with pytest.raises(ValueError, match="float32"):
        backends.wants_cpu_kernels(bf16, None)
    monkeypatch.setenv(backends.ENV, "maybe")
    with pytest.raises(ValueError, match=backends.ENV):
        backends.wants_cpu_kernels(fp32, None)


def test_cpu_kernels_true_on_a_bf16_target_is_a_clear_error(monkeypatch):
    monkeypatch.delenv(backends.ENV, raising=False)
    target = tm.llama_target().to(torch.bfloat16)
    prompt = tm.random_prompts(1, seed=2)[0]
    with pytest.raises(ValueError, match=r"cpu_kernels=True needs a float32 target on CPU.*bfloat16"):
        target.generate(
            prompt, max_new_tokens=8, do_sample=False, assistant_model=CascadeAssistant([MaxGram()], cpu_kernels=True)
        )
    with pytest.raises(ValueError, match="float32"):
        with hf_cascade.cpu_kernels(target):
            pass
    assert all("forward" not in vars(m) for m in target.modules())


@pytest.mark.parametrize("vocab", [tm.VOCAB, 40000])
def test_plain_generate_inside_cpu_kernels(vocab):
    """Same tokens as plain ``generate``; the decoder linears (and a large head) are switched inside and
    restored on exit."""
    target = tm.llama(vocab_size=vocab, block_scale=0.005)
    prompt = tm.random_prompts(1, seed=2)[0]
    ref = target.generate(prompt, max_new_tokens=24, do_sample=False)
    with hf_cascade.cpu_kernels(target) as session:
        assert session.backend == "cpu" and session.block_rows >= 1
        switched = [m for m in target.modules() if "forward" in vars(m)]
        assert len(switched) == 14 + (vocab >= 32768)  # 2 layers x 7 linears (+ the head)
        out = target.generate(prompt, max_new_tokens=24, do_sample=False)
    assert torch.equal(out, ref)
    assert all("forward" not in vars(m) for m in target.modules())
