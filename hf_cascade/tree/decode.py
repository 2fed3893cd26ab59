"""Tree-verified assisted decoding: the loop a :class:`~hf_cascade.tree.strategy.TreeAssistant` runs
in place of transformers' ``_assisted_decoding`` (batch size 1).

:func:`tree_decode`, step by step (the numbers are those of the code):

1. **Prefill** the target on the prompt minus its last token, into a plain ``DynamicCache()`` (no
   config: transformers' sliding-window cache layers would evict K/V that a long tree still needs;
   the window is applied by the tree mask, see :mod:`hf_cascade.tree.forward`). The last prompt
   token is the first tree's root, so the prefill emits nothing and the first verification already
   carries a tree.
2. **Draft** a tree below ``seq[-1]`` (:meth:`TreeDrafter.draft_tree`, given a
   :class:`~hf_cascade.tree.strategy.TreeStep`), pruned to what can still be emitted: no node deeper
   than the length budget, nothing below an EOS node.
3. **Verify** ``[root, nodes]`` in one target forward (4D tree mask, each node at its branch
   position) through the target's decoder only
   (:func:`~hf_cascade.tree.forward.verify_tree` with ``hidden_only``): the final hidden states ``[n + 1, H]``,
   which also give the next :class:`TreeStep` its hidden state at no extra forward. The output head
   runs later, on the rows acceptance reads (:mod:`hf_cascade.tree.rows`). Step 1 checks that
   :func:`~hf_cascade.tree.forward.output_head` reproduces the target's own logits; if it does
   not (or the prompt has one token), the full forward :func:`~hf_cascade.tree.forward.verify_tree`
   computes every row and a forward pre-hook on the head captures the hidden states.
4. **Accept** on *processed* logits (:class:`~hf_cascade.tree.rows.TreeRows`): row ``r`` goes
   through the generation's ``LogitsProcessorList`` with ``input_ids`` = the sequence up to that
   row's node (``seq`` + the node's ancestor path + the node), exactly what plain ``generate``
   would pass if it had decoded that path. Greedy: :func:`greedy_tree_accept`; sampling:
   :func:`sampling_tree_accept` on their softmax (recursive rejection sampling, lossless). Both
   walk from the root and read only the rows they reach.
5. **Keep** the accepted path's K/V (:func:`~hf_cascade.tree.forward.keep_path`).
6. **Emit** the accepted tokens and the target's bonus token one at a time, checking the stopping
   criteria (EOS, ``max_length``, custom ones) after each token as plain ``generate`` does, so the
   path is cut exactly where plain decoding would stop; stream them (one ``streamer.put`` per step,
   like transformers' assisted loop); collect scores / logits when asked.

Returns what transformers returns: the ``[1, L']`` sequences, or a ``GenerateDecoderOnlyOutput``
(``sequences``, ``scores``, ``logits``, ``past_key_values``) when ``return_dict_in_generate``.

Cost of steps 3-4: the transformer layers run on all ``n + 1`` tokens; the output head and the
logits processors only on the rows the acceptance walk reads (about ``accepted + 2``, in one or two
head calls; ``TreeStats.head_rows`` records them per step), each processor call on a sequence of
length ``L + depth + 1``.
"""

from __future__ import annotations

import inspect

import torch
from transformers import DynamicCache, GenerationConfig, LogitsProcessorList, PreTrainedModel
from transformers.generation.utils import GenerateDecoderOnlyOutput

from ..processors import DraftAwareProcessor
from ..stats import PhaseTimer
from ..verify_head import active_head
from .accept import greedy_tree_accept, sampling_tree_accept
from .forward import keep_path, output_head, verify_tree
from .rows import TreeRows
from .strategy import TreeDrafter, TreeStats, TreeStep
from .structure import TokenTree

# model_kwargs that generate() prepares and this loop may ignore (checked by check_tree_supported).
_IGNORED_KWARGS = {"attention_mask", "position_ids", "cache_position", "logits_to_keep", "past_key_values", "use_cache"}


@torch.no_grad()
def tree_decode(
    target: PreTrainedModel,
    drafter: TreeDrafter,
    input_ids: torch.Tensor,
    logits_processor: LogitsProcessorList | None,
    stopping_criteria,
    generation_config: GenerationConfig,
    stats: TreeStats,
    streamer=None,
):
    """Generate with tree drafts from ``drafter`` (see the module docstring for the steps)."""
    cfg = generation_config
    processors = logits_processor or LogitsProcessorList()
    scores = () if cfg.return_dict_in_generate and cfg.output_scores else None
    raw_logits = () if cfg.return_dict_in_generate and cfg.output_logits else None
    stop_ids = _stop_tensor(cfg)
    timer = PhaseTimer(stats)
    seq = input_ids[0].to(target.device)
    cache = DynamicCache()
    heads = _HeadInput(target)
    fast = active_head(target)                  # the CPU verification head, if installed: its block size
    block_rows = fast.block_rows if fast is not None else 4
    done, step = False, 0
    with heads:
        # 1. Prefill everything but the root.
        with timer("prefill"):
            last_hidden, head = _prefill(target, cache, seq[:-1], heads)
        while not done:
            L = seq.shape[0]
            state = TreeStep(seq, cache, last_hidden, budget=max(cfg.max_length - L - 1, 0), step=step)
            # 2. Draft, then prune what can never be emitted.
            with timer("draft"):
                tree, draft_probs = drafter.draft_tree(seq, state)
                tree, draft_probs = prune_tree(tree, draft_probs, state.budget, stop_ids)
            # 3. Verify: one forward over [root, nodes]; hidden[r] is the head input of row r.
            with timer("verify"):
                if head is not None:
                    hidden = verify_tree(target, cache, L - 1, tree, seq[-1], hidden_only=True)  # [n + 1, H]
                    rows = TreeRows(tree, seq, processors, hidden=hidden, head=head, block_rows=block_rows)
                else:
                    raw = verify_tree(target, cache, L - 1, tree, seq[-1])                 # [n + 1, V]
                    hidden = heads.rows()                                                # [n + 1, H] or None
                    rows = TreeRows(tree, seq, processors, raw=raw)
            # 4. Accept, on logits processed with each row's own ancestor path (read lazily).
            with timer("accept"):
                if cfg.do_sample:
                    acceptance = sampling_tree_accept(tree, rows.softmax(), draft_probs)
                else:
                    acceptance = greedy_tree_accept(tree, rows)
            # 5. Keep the accepted path's K/V: the cache now holds seq[:-1] + root + path.
            path = acceptance.path.to(seq.device)
            keep_path(cache, L - 1, path)
            src = torch.cat([path.new_zeros(1), path + 1]).tolist()        # row that produced each new token
            new = torch.cat([tree.tokens.to(seq.device)[path], seq.new_tensor([acceptance.bonus])])
            # 6. Emit token by token, stopping exactly where plain generate() would.
            emitted = 0
            for j in range(new.shape[0]):
                seq = torch.cat([seq, new[j : j + 1]])
                emitted += 1
                if scores is not None:
                    scores += (rows[src[j]][None],)
                if raw_logits is not None:
                    raw_logits += (rows.raw(src[j])[None],)
                if _should_stop(seq, scores, stopping_criteria, cfg.max_length, stop_ids):
                    done = True
                    break
            if emitted < new.shape[0]:
                cache.crop(-(new.shape[0] - emitted))                   # a cut path: keep what was emitted
            if streamer is not None:
                streamer.put(new[None, :emitted].cpu())
            last_hidden = hidden[src[emitted - 1]] if hidden is not None else None
            stats.record_tree_step(tree, acceptance, emitted, rows.rows_computed, max(rows.head_calls, 1))
            step += 1
            drafter.on_accept(tree, acceptance, TreeStep(seq, cache, last_hidden, max(cfg.max_length - seq.shape[0] - 1, 0), step))
    if streamer is not None:
        streamer.end()
    if cfg.return_dict_in_generate:
        return GenerateDecoderOnlyOutput(sequences=seq[None], scores=scores, logits=raw_logits, past_key_values=cache)
    return seq[None]


# -- the steps' helpers -------------------------------------------------------------------------

def _prefill(target: PreTrainedModel, cache: DynamicCache, tokens: torch.Tensor, heads: "_HeadInput"):
    """Run ``tokens`` (``[L - 1]``) into ``cache``. Returns the hidden state of the last one (or
    ``None``) and :func:`~hf_cascade.tree.forward.output_head` if it reproduces the target's logits
    of that token (else ``None``: verification then computes every row with the full model)."""
    if tokens.numel() == 0:
        return None, None
    kwargs = {"logits_to_keep": 1} if "logits_to_keep" in inspect.signature(target.forward).parameters else {}
    logits = target(input_ids=tokens[None], past_key_values=cache, use_cache=True, **kwargs).logits[0, -1]
    hidden = heads.rows()
    if hidden is None:
        return None, None
    head = output_head(target)
    if head is not None and not torch.allclose(head(hidden[-1:])[0].float(), logits.float(), rtol=1e-4, atol=1e-4):
        head = None
    return hidden[-1], head


def prune_tree(
    tree: TokenTree, draft_probs: torch.Tensor | None, budget: int, stop_ids: torch.Tensor | None
) -> tuple[TokenTree, torch.Tensor | None]:
    """Drop nodes that can never be emitted: depth ``>= budget``, or below a stop (EOS) token.

    Whole subtrees are removed and every kept node keeps all its kept siblings, so
    ``sampling_tree_accept`` stays exact (a node whose children are all gone is a leaf, whose bonus
    token is drawn from the target's own distribution)."""
    n = tree.num_nodes
    if draft_probs is not None and draft_probs.shape[0] != n:
        raise ValueError(f"draft_probs must have one row per tree node: {n} nodes, {draft_probs.shape[0]} rows")
    if n == 0:
        return tree, draft_probs
    keep = tree.depth < budget
    if stop_ids is not None and stop_ids.numel():
        anc = tree.ancestor_mask() & ~torch.eye(n, dtype=torch.bool, device=tree.tokens.device)
        is_stop = torch.isin(tree.tokens, stop_ids.to(tree.tokens.device))
        keep &= ~(anc & is_stop[None, :]).any(dim=-1)
    if bool(keep.all()):
        return tree, draft_probs
    return tree.select(keep), (draft_probs[keep.to(draft_probs.device)] if draft_probs is not None else None)


def _should_stop(seq, scores, stopping_criteria, max_length: int, stop_ids) -> bool:
    if stopping_criteria is not None and bool(stopping_criteria(seq[None], scores).any()):
        return True
    if seq.shape[0] >= max_length:
        return True
    return stop_ids is not None and bool(torch.isin(seq[-1], stop_ids.to(seq.device)))


def _stop_tensor(cfg: GenerationConfig) -> torch.Tensor | None:
    eos = getattr(cfg, "_eos_token_tensor", None)
    if eos is None and cfg.eos_token_id is not None:
        eos = torch.as_tensor(cfg.eos_token_id)
    return None if eos is None else eos.flatten().long()


class _HeadInput:
    """Within the block, remembers the input of ``model``'s output head at each forward: the final
    hidden states ``[1, T, H]`` (``T`` = rows whose logits are computed)."""

    def __init__(self, model: PreTrainedModel):
        get = getattr(model, "get_output_embeddings", None)
        self.head = get() if get is not None else None
        self.value: torch.Tensor | None = None
        self._handle = None

    def _hook(self, module, args):
        self.value = args[0] if args else None

    def __enter__(self) -> "_HeadInput":
        if isinstance(self.head, torch.nn.Module):
            self._handle = self.head.register_forward_pre_hook(self._hook)
        return self

    def __exit__(self, *exc) -> None:
        if self._handle is not None:
            self._handle.remove()

    def rows(self) -> torch.Tensor | None:
        """The last forward's ``[T, H]`` head input (then forgotten), or ``None``."""
        value, self.value = self.value, None
        return value.reshape(-1, value.shape[-1]) if value is not None else None


# -- what the loop does not support -------------------------------------------------------------------

def check_tree_supported(input_ids, logits_processor, generation_config: GenerationConfig, synced_gpus: bool, model_kwargs: dict) -> None:
    """Clear errors for inputs :func:`tree_decode` cannot honour (beyond ``Assistant.check_supported``)."""
    if not model_kwargs.get("use_cache", True):
        raise ValueError("tree assistants need use_cache=True (the target's KV cache holds the verified prefix).")
    if synced_gpus:
        raise ValueError("tree assistants do not support synced_gpus.")
    cfg = generation_config
    if cfg.return_dict_in_generate and (cfg.output_attentions or cfg.output_hidden_states):
        raise ValueError("tree assistants return sequences, scores and logits; not attentions or hidden states.")
    if (getattr(cfg, "num_return_sequences", 1) or 1) > 1:
        raise ValueError("tree assistants support num_return_sequences=1 only.")
    if any(isinstance(p, DraftAwareProcessor) for p in (logits_processor or [])):
        raise ValueError("lossy target rules (LossyLenientTarget, LossyTypicalAcceptance) review linear drafts; "
                         "tree assistants do not support them.")
    cache = model_kwargs.get("past_key_values")
    if cache is not None and hasattr(cache, "get_seq_length") and cache.get_seq_length() > 0:
        raise ValueError("tree assistants start from the prompt: a prefilled past_key_values is not supported.")
    mask = model_kwargs.get("attention_mask")
    if mask is not None and not bool((mask != 0).all()):
        raise ValueError("tree assistants do not support padding (an attention_mask with zeros).")
    positions = model_kwargs.get("position_ids")
    if positions is not None and not torch.equal(positions.reshape(-1).cpu(), torch.arange(input_ids.shape[1])):
        raise ValueError("tree assistants do not support custom position_ids.")
    extra = sorted(k for k, v in model_kwargs.items() if v is not None and k not in _IGNORED_KWARGS)
    if extra:
        raise ValueError(f"tree assistants support token inputs only; unsupported model inputs: {extra}.")
