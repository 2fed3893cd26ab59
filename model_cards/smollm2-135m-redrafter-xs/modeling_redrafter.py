"""The ReDrafter head: a recurrent draft head over the target's last hidden state.

Cheng et al. (2024), "Recurrent Drafter for Fast Speculative Decoding in Large Language Models",
Section 2. With ``x`` the target's last-layer output at the current position and ``e_i`` the
target's embedding of the ``i``-th token of a draft (``e_1`` = the token the target itself produced
from ``x``)::

    s_i = f(U s_{i-1} + W e_i + b)          f = SiLU (one-layer RNN)
    h_i = [x, s_i]                           (context first, as in the reference code)
    p(token_{i+1}) = softmax(LMHead(h_i))    LMHead = [input_proj] -> residual blocks -> vocabulary

Conventions follow the reference implementation (``apple/ml-recurrent-drafter``,
``recurrent_drafting/modeling_drafter.py`` and ``train/model.py``) so its checkpoints load with
``load_state_dict(strict=True)``; where the paper's text differs, the code wins:

* ``s_0 = 0`` by default (the reference's beam search and trainer), so ``s_1 = f(W e_1 + b)``; the
  paper writes ``s_0 = e_0``: pass ``state=e_0`` to :meth:`ReDrafterModel.forward` for that variant.
* ``h_i`` concatenates ``[x, s_i]`` (the paper writes ``[s_i, x]``; only the order of ``input_proj``'s /
  the first block's input columns differs).
* ``rnn=False`` is the paper's simplified drafter ``s_i = s_{i-1} + e_i``.
* The reference's ``compute_logits`` also subtracts the max and keeps the top 50 logits for its beam
  search; :meth:`ReDrafterModel.logits` returns the raw logits (beam search lives elsewhere).

The head does not own the target's embedding table (too big to ship): callers pass token
EMBEDDINGS computed with the target's input embeddings. Weight names (``input_proj``,
``lm_head.{i}.linear`` for the residual blocks, ``lm_head.{num_draft_layers}`` for the vocabulary
projection, ``rnn_u`` (with the bias ``b``), ``rnn_w``, ``emb_norm``) are the reference's.

Remote-code ready: imports only torch, transformers and its own configuration file.
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedModel
from transformers.utils import ModelOutput

from .configuration_redrafter import ReDrafterConfig


@dataclass
class ReDrafterOutput(ModelOutput):
    """``logits``: ``[B, ..., K, V]`` (or ``[B, ..., K, N]``), step ``k`` predicting the token after
    the one embedded in ``inputs_embeds[..., k, :]``; ``states``: ``[B, ..., K, H]``, ``s_1 .. s_K``."""

    logits: torch.FloatTensor | None = None
    states: torch.FloatTensor | None = None


class ReDrafterResBlock(nn.Module):
    """``x + SiLU(W x + b)`` (the reference's ``ResBlock``; weight names ``linear.{weight,bias}``)."""

    def __init__(self, dim: int):
        super().__init__()
        self.linear = nn.Linear(dim, dim, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + F.silu(self.linear(x))


class ReDrafterRMSNorm(nn.Module):
    """RMSNorm with weight ``[H]``; only instantiated for ``emb_norm=True`` checkpoints, never applied."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        var = x.float().pow(2).mean(-1, keepdim=True)
        return (x.float() * torch.rsqrt(var + self.eps)).to(x.dtype) * self.weight


class ReDrafterModel(PreTrainedModel):
    """Recurrent draft head. Inputs: the target's last hidden state ``x`` and target token embeddings.

    Parameters (reference names and shapes; ``H`` = hidden_size, ``D`` = exit_dim, ``V'`` = ``N`` if
    ``draft_vocab_size`` is set else ``V``):
        ``input_proj``          Linear(2H -> D, bias)   only when ``D != 2H``
        ``lm_head.{i}.linear``  Linear(D -> D, bias)    ``i < num_draft_layers``
        ``lm_head.{L}``         Linear(D -> V', no bias) ``L = num_draft_layers``
        ``rnn_u``               Linear(H -> H, bias)    ``U`` and ``b``; only when ``rnn``
        ``rnn_w``               Linear(H -> H, no bias) ``W``; only when ``rnn``
        ``emb_norm``            RMSNorm(H)              only when ``emb_norm`` (unused)
    Buffer ``vocab_subset`` ``[N]`` (sorted target ids), only when ``draft_vocab_size`` is set.
    """

    config_class = ReDrafterConfig
    main_input_name = "inputs_embeds"
    _no_split_modules = []

    def __init__(self, config: ReDrafterConfig):
        super().__init__(config)
        h, d = config.hidden_size, config.exit_dim
        self.input_proj = nn.Linear(2 * h, d, bias=True) if d != 2 * h else None
        out = config.draft_vocab_size if config.draft_vocab_size is not None else config.vocab_size
        self.lm_head = nn.Sequential(
            *[ReDrafterResBlock(d) for _ in range(config.num_draft_layers)],
            nn.Linear(d, out, bias=False),
        )
        self.rnn_u = nn.Linear(h, h, bias=True) if config.rnn else None
        self.rnn_w = nn.Linear(h, h, bias=False) if config.rnn else None
        self.emb_norm = ReDrafterRMSNorm(h, config.rms_norm_eps) if config.emb_norm else None
        if config.draft_vocab_size is not None:
            self.register_buffer(
                "vocab_subset", torch.arange(config.draft_vocab_size, dtype=torch.long), persistent=True
            )
        else:
            self.vocab_subset = None
        self.post_init()

    def get_output_embeddings(self):
        return None  # nothing to tie: the head has no input embedding table

    def save_pretrained(self, save_directory, *args, **kwargs):
        """``PreTrainedModel.save_pretrained``; when the class is registered for an Auto class (so the
        code is saved with the weights), config.json's ``auto_map`` names this class for both
        ``AutoModel`` (its class, as in the reference) and ``AutoModelForCausalLM`` (the class
        ``hf_cascade.loading.load_head`` loads every head with; the head is not a causal LM)."""
        if self._auto_class is not None:
            ref = f"{type(self).__module__.rsplit('.', 1)[-1]}.{type(self).__name__}"
            auto_map = dict(getattr(self.config, "auto_map", None) or {})
            for name in ("AutoModel", "AutoModelForCausalLM"):
                auto_map.setdefault(name, ref)
            self.config.auto_map = auto_map
        return super().save_pretrained(save_directory, *args, **kwargs)

    # -- vocabulary ----------------------------------------------------------------------------
    @property
    def draft_vocab_size(self) -> int:
        """Number of output columns: ``N`` with a vocabulary subset, else ``V``."""
        n = self.config.draft_vocab_size
        return self.config.vocab_size if n is None else n

    @torch.no_grad()
    def set_vocab_subset(self, ids) -> None:
        """Set the ``N`` target ids the head predicts (sorted, unique, in ``[0, vocab_size)``)."""
        if self.vocab_subset is None:
            raise ValueError("This head predicts the full vocabulary (draft_vocab_size=None); it has no subset.")
        ids = torch.as_tensor(ids, dtype=torch.long).flatten().cpu()
        n, v = self.config.draft_vocab_size, self.config.vocab_size
        if ids.numel() != n:
            raise ValueError(f"vocab_subset must hold draft_vocab_size={n} ids, got {ids.numel()}.")
        if n > 1 and not bool((ids[1:] > ids[:-1]).all()):
            raise ValueError("vocab_subset must be sorted ascending without duplicates.")
        if int(ids[0]) < 0 or int(ids[-1]) >= v:
            raise ValueError(f"vocab_subset ids must lie in [0, {v}), got [{int(ids[0])}, {int(ids[-1])}].")
        self.vocab_subset.copy_(ids.to(self.vocab_subset.device))

    def to_draft_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Target ids (any shape) -> output columns in ``[0, N]``; ids outside the subset map to ``N``
        (identity without a subset)."""
        if self.vocab_subset is None:
            return input_ids
        subset = self.vocab_subset
        ids = input_ids.to(subset.device)
        pos = torch.searchsorted(subset, ids.contiguous()).clamp_max(subset.numel() - 1)
        return torch.where(subset[pos] == ids, pos, torch.full_like(pos, subset.numel()))

    def to_target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        """Output columns ``[0, N)`` -> target ids (identity without a subset)."""
        return draft_ids if self.vocab_subset is None else self.vocab_subset[draft_ids.to(self.vocab_subset.device)]

    # -- the recurrence ------------------------------------------------------------------------
    def init_state(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """``s_0 = 0``: ``[B, ..., H]`` zeros like the context ``x`` (the reference's initial state)."""
        return torch.zeros_like(hidden_states)

    def step(self, state: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:
        """One recurrent step ``s_i = SiLU(U s_{i-1} + W e_i + b)`` (``rnn=False``: ``s_{i-1} + e_i``).

        ``state``: ``[..., H]``; ``emb``: ``[..., H]`` (the target's embedding of the previous draft
        token; broadcastable). Returns ``[..., H]``."""
        emb = emb.to(state.dtype)
        if self.rnn_u is None:
            return state + emb
        return F.silu(self.rnn_u(state) + self.rnn_w(emb))

    def logits(self, state: torch.Tensor, hidden_states: torch.Tensor, full_vocab: bool = True) -> torch.Tensor:
        """Next-token logits from ``h = [x, s]``.

        ``state`` ``s``: ``[..., H]``; ``hidden_states`` ``x``: ``[..., H]`` (broadcast against ``state``).
        Returns ``[..., V]`` (``full_vocab``; ``finfo.min`` outside the subset) or ``[..., N]``."""
        x, s = torch.broadcast_tensors(hidden_states.to(state.dtype), state)
        h = torch.cat([x, s], dim=-1)  # [..., 2H]
        if self.input_proj is not None:
            h = self.input_proj(h)  # [..., D]
        reduced = self.lm_head(h)  # [..., N] (or [..., V])
        if not full_vocab or self.vocab_subset is None:
            return reduced
        full = reduced.new_full((*reduced.shape[:-1], self.config.vocab_size), torch.finfo(reduced.dtype).min)
        return full.index_copy_(-1, self.vocab_subset.to(reduced.device), reduced)  # [..., V]

    def forward(
        self,
        hidden_states: torch.Tensor,
        inputs_embeds: torch.Tensor,
        state: torch.Tensor | None = None,
        full_vocab: bool = True,
        return_dict: bool | None = None,
        **kwargs,
    ) -> ReDrafterOutput:
        """Run ``K`` recurrent steps from each context, teacher-forced on the given embeddings.

        Args:
            hidden_states: ``x``, ``[B, ..., H]``: the target's last hidden state (one per context).
            inputs_embeds: ``[B, ..., K, H]``: ``e_1 .. e_K``, the target's input embeddings of the
                tokens fed to the recurrence (``e_1``: the token the target produced from ``x``).
            state: ``s_0``, ``[B, ..., H]``; default zeros (the reference). Pass ``e_0`` for the
                paper's ``s_0 = e_0``.
            full_vocab: return ``[.., V]`` logits (``finfo.min`` outside the subset) or ``[.., N]``.

        Returns :class:`ReDrafterOutput` with ``logits`` ``[B, ..., K, V]`` (step ``k`` predicts the
        token after the one embedded at ``k``) and ``states`` ``[B, ..., K, H]``."""
        if inputs_embeds.shape[:-2] != hidden_states.shape[:-1]:
            raise ValueError(
                f"inputs_embeds {tuple(inputs_embeds.shape)} must be [*x.shape[:-1], K, H] "
                f"for hidden_states {tuple(hidden_states.shape)}."
            )
        s = self.init_state(hidden_states) if state is None else state  # [B, ..., H]
        states = []
        for k in range(inputs_embeds.shape[-2]):
            s = self.step(s, inputs_embeds[..., k, :])  # [B, ..., H]
            states.append(s)
        states = torch.stack(states, dim=-2)  # [B, ..., K, H]
        logits = self.logits(states, hidden_states.unsqueeze(-2), full_vocab)  # [B, ..., K, V]
        out = ReDrafterOutput(logits=logits, states=states)
        return out if return_dict is not False else out.to_tuple()
