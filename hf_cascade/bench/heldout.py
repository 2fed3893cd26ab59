"""What a trained head does in ``generate``: tokens per target call on held-out prompts, through the real path.

``hf-cascade train`` evaluates a head teacher-forced while it trains (exact greedy acceptance, ``tau@k``). At the end
it also hands the saved checkpoint's folder to its assistant the way a user will (by path) and runs greedy
``generate`` with the head's default assistant on the prompts of held-out records (never trained on): the tokens each
target call emits, and whether every output equals plain ``generate``'s (it must: greedy decoding is lossless). The
result goes into ``trainer_state.json`` (``"generation"``) and into the model card.

The assistants are the ones the card shows: ``CascadeAssistant([drafter, MaxGram()])`` for a vanilla drafter,
``GlideAssistant(head)``, ``ReDrafterAssistant(head)``, each with its defaults (their payoff rules may draft less
where drafting does not pay on the machine that measures).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from tqdm.auto import tqdm

from ..training.loop import split_records
from ..training.store import DistillStore

__all__ = ["measure_generation", "record_generation"]

_SECTION = "## Measured in generate (held-out prompts)"


def _assistant(kind: str, head):
    from ..cascade import CascadeAssistant
    from ..drafters import MaxGram
    from ..glide import GlideAssistant
    from ..redrafter import ReDrafterAssistant

    makers = {
        "vanilla": lambda h: CascadeAssistant([h, MaxGram()]),
        "glide": GlideAssistant,
        "redrafter": ReDrafterAssistant,
    }
    if kind not in makers:
        raise ValueError(f"unknown head kind {kind!r}; one of {sorted(makers)}")
    return makers[kind](head)


@torch.no_grad()
def measure_generation(
    target,
    head_dir: str | Path,
    kind: str,
    data: str | Path,
    eval_records: int,
    prompts: int = 8,
    max_new_tokens: int = 64,
    progress: bool = True,
) -> dict:
    """Greedy ``generate`` with the head saved in ``head_dir`` on the prompts of up to ``prompts`` held-out records
    of ``data`` (the split :func:`~hf_cascade.training.loop.split_records` makes with ``eval_records``):
    ``{"prompts", "max_new_tokens", "tokens_per_call", "identical", "assistant"}``, ``identical`` the share of
    outputs equal to plain ``generate``'s."""
    store = DistillStore.open(data)
    _, held = split_records(store, eval_records)
    held = held[:prompts]
    if not held:
        raise ValueError(f"{data} has no held-out records to measure on")
    assistant = _assistant(kind, str(head_dir))  # by path, as a user passes it
    device = target.get_input_embeddings().weight.device
    calls = tokens = same = 0
    for i in tqdm(held, desc="generate (held-out)", unit="prompt", disable=not progress):
        ids, prompt_len = store.sequence(i)
        prompt = torch.as_tensor(ids[:prompt_len].astype("int64"), device=device)[None]
        mask = torch.ones_like(prompt)
        plain = target.generate(prompt, attention_mask=mask, do_sample=False, max_new_tokens=max_new_tokens)
        out = target.generate(
            prompt, attention_mask=mask, do_sample=False, max_new_tokens=max_new_tokens, assistant_model=assistant
        )
        stats = assistant.last_stats
        calls += stats.target_calls  # tokens_per_target_call, summed over the prompts
        tokens += stats.new_tokens
        same += int(torch.equal(out, plain))
    return {
        "prompts": len(held),
        "max_new_tokens": max_new_tokens,
        "tokens_per_call": round(tokens / max(calls, 1), 3),
        "identical": round(same / len(held), 3),
        "assistant": type(assistant).__name__,
    }


def record_generation(out: str | Path, measured: dict) -> None:
    """Write ``measured`` into ``out``'s ``trainer_state.json`` (``"generation"``) and its model card (a section
    before the licence; replaced when it is there already)."""
    out = Path(out)
    state_file = out / "trainer_state.json"
    if state_file.is_file():
        state = json.loads(state_file.read_text())
        state["generation"] = measured
        state_file.write_text(json.dumps(state, indent=1) + "\n")
    card = out / "README.md"
    if not card.is_file():
        return
    section = (
        f"{_SECTION}\n\nGreedy `generate` with `{measured['assistant']}` and its defaults, on the prompts of "
        f"{measured['prompts']} held-out records, at most {measured['max_new_tokens']} new tokens each, on the "
        "machine that trained it (its payoff rules draft what pays there):\n\n"
        "| tokens per target call | outputs identical to plain `generate` |\n|---:|---:|\n"
        f"| {measured['tokens_per_call']:.2f} | {measured['identical']:.0%} |\n\n"
    )
    text = card.read_text()
    if _SECTION in text:  # a second measure replaces the first
        start = text.index(_SECTION)
        end = text.find("\n## ", start + len(_SECTION))
        text = text[:start] + (text[end + 1 :] if end >= 0 else "")
    at = text.find("\n## License")
    text = text.rstrip() + "\n\n" + section if at < 0 else text[: at + 1] + section + text[at + 1 :]
    card.write_text(text)
