"""Configuration of the hf_cascade ReDrafter head (remote-code ready: imports only transformers)."""

from transformers import PretrainedConfig


class ReDrafterConfig(PretrainedConfig):
    r"""Configuration of :class:`ReDrafterModel`, the recurrent draft head of Cheng et al. (2024),
    "Recurrent Drafter for Fast Speculative Decoding in Large Language Models".

    The first six fields are those of the reference implementation (``apple/ml-recurrent-drafter``,
    ``recurrent_drafting/configuration_drafter.py``: ``DrafterConfig``; ``emb_norm`` and
    ``rms_norm_eps`` come from its MLX ``ModelArgs``), with the same meaning, so their config.json
    maps field by field (see ``hf_cascade/heads/redrafter/convert.py``).

    Args:
        vocab_size: ``V``, the TARGET's vocabulary size (full-vocabulary logits use it).
        hidden_size: ``H``, the target's hidden size; also the size of the RNN state and of the
            target's token embeddings the head consumes.
        exit_dim: width of the residual blocks. The head's input is ``[x, s]`` (``2 H``); when
            ``exit_dim != 2 H`` a projection ``input_proj`` maps it to ``exit_dim``. Default ``2 H``
            (the reference training recipe's choice: no projection).
        num_draft_layers: number of residual blocks ``x + SiLU(W x + b)`` before the vocabulary projection.
        num_lookback_tokens: unused by the model; kept because the reference config carries it.
        rnn: ``True``: ``s_i = SiLU(U s_{i-1} + W e_i + b)``; ``False``: the paper's simplified drafter
            (``U = W = I``, ``b = 0``, identity ``f``), ``s_i = s_{i-1} + e_i``.
        emb_norm: create an (unused) RMSNorm ``emb_norm`` over embeddings, for checkpoints that carry
            its weight (the reference keeps it for parity with its trainer and never applies it).
        rms_norm_eps: epsilon of ``emb_norm``.
        draft_vocab_size: ``N``: when set, the head predicts only ``N`` target ids (the model's
            persistent ``vocab_subset`` buffer, FR-Spec style as in ``hf_cascade.heads.drafter``);
            ``None`` (default, the reference layout): the full vocabulary, no buffer.
        initializer_range: std of the normal initialisation of fresh linear layers.
        target_name_or_path: informational, the target this head was trained for.
    """

    model_type = "hf_cascade_redrafter"

    def __init__(
        self,
        vocab_size: int = 32000,
        hidden_size: int = 4096,
        exit_dim: int | None = None,
        num_draft_layers: int = 2,
        num_lookback_tokens: int = -1,
        rnn: bool = True,
        emb_norm: bool = False,
        rms_norm_eps: float = 1e-5,
        draft_vocab_size: int | None = None,
        initializer_range: float = 0.02,
        target_name_or_path: str | None = None,
        **kwargs,
    ):
        if vocab_size <= 0 or hidden_size <= 0:
            raise ValueError(f"vocab_size and hidden_size must be positive, got {vocab_size}, {hidden_size}.")
        if num_draft_layers < 0:
            raise ValueError(f"num_draft_layers must be >= 0, got {num_draft_layers}.")
        if exit_dim is None or exit_dim <= 0:  # the reference's default is -1 ("unset")
            exit_dim = 2 * hidden_size
        if draft_vocab_size is not None and not 0 < draft_vocab_size <= vocab_size:
            raise ValueError(
                f"draft_vocab_size must be None or in [1, vocab_size={vocab_size}], got {draft_vocab_size}."
            )
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.exit_dim = exit_dim
        self.num_draft_layers = num_draft_layers
        self.num_lookback_tokens = num_lookback_tokens
        self.rnn = bool(rnn)
        self.emb_norm = bool(emb_norm)
        self.rms_norm_eps = rms_norm_eps
        self.draft_vocab_size = draft_vocab_size
        self.initializer_range = initializer_range
        self.target_name_or_path = target_name_or_path
        kwargs.setdefault("tie_word_embeddings", False)  # the head owns no input embedding to tie to
        super().__init__(**kwargs)
