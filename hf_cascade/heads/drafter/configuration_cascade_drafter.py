"""Configuration of the hf_cascade "vanilla" drafter (remote-code ready: imports only transformers)."""

from transformers import PretrainedConfig


class CascadeDrafterConfig(PretrainedConfig):
    r"""Configuration of :class:`CascadeDrafterForCausalLM`: a small Llama-style causal LM that predicts
    over a reduced vocabulary (``draft_vocab_size`` target token ids, FR-Spec style) but reads and
    writes the target's full vocabulary.

    Args:
        vocab_size: the TARGET's vocabulary size ``V`` (inputs and full-vocabulary logits use it).
        draft_vocab_size: ``N``, the number of target ids the drafter can predict (the subset is the
            model's ``vocab_subset`` buffer, saved with the weights).
        hidden_size, intermediate_size, num_hidden_layers, num_attention_heads, num_key_value_heads,
        head_dim, max_position_embeddings, rope_theta, rms_norm_eps, hidden_act, initializer_range:
            the Llama backbone (``head_dim`` defaults to ``hidden_size // num_attention_heads``).
        tie_word_embeddings: tie the reduced output head to the reduced input embedding.
        target_name_or_path: informational, the target this drafter was trained for.
    """

    model_type = "hf_cascade_drafter"
    keys_to_ignore_at_inference = ["past_key_values", "cache"]

    def __init__(
        self,
        vocab_size: int = 262144,
        draft_vocab_size: int = 32768,
        hidden_size: int = 256,
        intermediate_size: int = 768,
        num_hidden_layers: int = 2,
        num_attention_heads: int = 4,
        num_key_value_heads: int | None = None,
        head_dim: int | None = None,
        max_position_embeddings: int = 8192,
        rope_theta: float = 10000.0,
        rms_norm_eps: float = 1e-6,
        hidden_act: str = "silu",
        tie_word_embeddings: bool = True,
        initializer_range: float = 0.02,
        bos_token_id: int | None = 2,
        eos_token_id: int | list[int] | None = 1,
        pad_token_id: int | None = 0,
        target_name_or_path: str | None = None,
        **kwargs,
    ):
        if not 0 < draft_vocab_size <= vocab_size:
            raise ValueError(f"draft_vocab_size must be in [1, vocab_size={vocab_size}], got {draft_vocab_size}.")
        self.vocab_size = vocab_size
        self.draft_vocab_size = draft_vocab_size
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_key_value_heads if num_key_value_heads is not None else num_attention_heads
        self.head_dim = head_dim if head_dim is not None else hidden_size // num_attention_heads
        self.max_position_embeddings = max_position_embeddings
        self.rope_theta = float(rope_theta)
        self.rms_norm_eps = rms_norm_eps
        self.hidden_act = hidden_act
        self.initializer_range = initializer_range
        self.target_name_or_path = target_name_or_path
        kwargs.pop("rope_parameters", None)  # written by no version of this config; never let it shadow rope_theta
        super().__init__(
            bos_token_id=bos_token_id,
            eos_token_id=eos_token_id,
            pad_token_id=pad_token_id,
            tie_word_embeddings=tie_word_embeddings,
            **kwargs,
        )
