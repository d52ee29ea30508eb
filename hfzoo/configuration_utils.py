"""The architecture fields shared by the three hfzoo configs, and their validation (in one place).

Every field is a plain JSON value (`config.json` stays readable) and is validated when the config is
built: a bad value raises an error naming the field, the value and what is allowed. Choices are the
keys of the registries in `hfzoo/modules/` (norms, norm positions, position embeddings) and of
transformers' `ACT2FN` (activations).
"""

from __future__ import annotations

from huggingface_hub.dataclasses import strict
from transformers import PreTrainedConfig
from transformers.activations import ACT2FN

from .modules.layer import NORM_POSITIONS
from .modules.norms import NORM_CLASSES
from .modules.positions import POSITION_EMBEDDING_TYPES
from .modules.stack import BLOCK_SHARING


@strict
class HfzooConfig(PreTrainedConfig):
    r"""Architecture fields common to the hfzoo encoder, decoder and encoder-decoder.

    Args:
        vocab_size: number of token ids (rows of the embedding matrix).
        hidden_size: model width d_model.
        num_hidden_layers: number of Transformer layers.
        num_attention_heads: attention heads per layer.
        head_dim: size of each head (T5's d_kv); None means `hidden_size // num_attention_heads`.
        intermediate_size: feed-forward inner width d_ff.
        hidden_act: feed-forward activation, a key of `transformers.activations.ACT2FN`.
        max_position_embeddings: longest sequence (tokens) the position scheme supports.
        position_embedding_type: one of `hfzoo.modules.positions.POSITION_EMBEDDING_TYPES`
            (`learned`: trained absolute embeddings added to the tokens; `sinusoidal`: the fixed
            sin/cos encodings of Vaswani et al. 2017; `none`: no position information).
        norm_type: `layer_norm` or `rms_norm` (`hfzoo.modules.norms.NORM_CLASSES`).
        norm_position: `pre` (norm before each sub-block, plus a final norm) or `post` (norm after
            each residual addition, no final norm), see `hfzoo.modules.layer`.
        embedding_norm: normalize the sum of token, position and token-type embeddings before the first
            layer (BERT's `embeddings.LayerNorm`, Devlin et al. 2019); uses `norm_type`.
        layer_norm_eps: epsilon of `nn.LayerNorm` (used when `norm_type="layer_norm"`).
        rms_norm_eps: epsilon of `RMSNorm` (used when `norm_type="rms_norm"`).
        attention_bias: biases in the q/k/v/o projections.
        mlp_bias: biases in the feed-forward projections.
        hidden_dropout_prob: dropout on embeddings, sub-block outputs and the feed-forward hidden layer.
        attention_probs_dropout_prob: dropout on attention probabilities.
        initializer_range: standard deviation of the normal initialisation of weight matrices.
        tie_word_embeddings: share the input embedding matrix with the output projection (Press & Wolf
            2017). In the encoder-decoder, the decoder's input embedding (see
            `tie_encoder_decoder_embeddings`).
        embedding_size: inner size E of factorized token embeddings (ALBERT, Lan et al. 2020 §3.1): a
            `(vocab_size, E)` matrix and an `E -> hidden_size` projection; a tied output head uses both
            factors, an untied one is a full `hidden_size -> vocab_size` matrix (as Mesh TensorFlow).
            None: one `(vocab_size, hidden_size)` matrix. See `hfzoo.modules.embeddings`.
        scale_embeddings: multiply token embeddings by sqrt(hidden_size) (Vaswani et al. 2017, §3.4).
        block_sharing: ALBERT-style cross-layer parameter sharing (Lan et al. 2020 §3.1): one layer's
            parameters used by every layer of a stack; one of `hfzoo.modules.stack.BLOCK_SHARING`
            (`none`; `all`; `encoder` / `decoder`: one stack of the encoder-decoder only). Refused together
            with a per-layer structure (experts on every k-th layer only, a relative bias table per layer).
        num_softmaxes: K > 1 makes every LM head a mixture of K softmaxes (Yang et al. 2018) whose
            `logits` are log-probabilities (see `hfzoo.modules.embeddings.VocabProjection`); 1: one softmax.
        use_cache: return key/value caches from the forward pass (generation).
        pad_token_id, bos_token_id, eos_token_id: special token ids (or None).

    Raises:
        huggingface_hub.errors.StrictDataclassClassValidationError: a field has a value outside its
            allowed set or range; the message names the field.
        ValueError: `hidden_size` not divisible by `num_attention_heads` when `head_dim` is not set.
    """

    model_type = "hfzoo"
    keys_to_ignore_at_inference = ["past_key_values"]

    vocab_size: int = 32000
    hidden_size: int = 512
    num_hidden_layers: int = 6
    num_attention_heads: int = 8
    head_dim: int | None = None
    intermediate_size: int = 2048
    hidden_act: str = "gelu"
    max_position_embeddings: int = 1024
    position_embedding_type: str = "learned"
    norm_type: str = "layer_norm"
    norm_position: str = "pre"
    embedding_norm: bool = False
    layer_norm_eps: float | int = 1e-5
    rms_norm_eps: float | int = 1e-6
    attention_bias: bool = True
    mlp_bias: bool = True
    hidden_dropout_prob: float | int = 0.0
    attention_probs_dropout_prob: float | int = 0.0
    initializer_range: float | int = 0.02
    tie_word_embeddings: bool = True
    use_cache: bool = True
    pad_token_id: int | None = None
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None
    # --- embeddings (issue 4)
    embedding_size: int | None = None
    scale_embeddings: bool = False
    block_sharing: str = "none"
    num_softmaxes: int = 1

    def __post_init__(self, **kwargs):
        if self.head_dim is None and self.num_attention_heads > 0:
            if self.hidden_size % self.num_attention_heads != 0:
                raise ValueError(
                    f"hidden_size ({self.hidden_size}) must be divisible by num_attention_heads "
                    f"({self.num_attention_heads}) unless head_dim is set"
                )
            self.head_dim = self.hidden_size // self.num_attention_heads
        super().__post_init__(**kwargs)

    def validate_hfzoo_architecture(self) -> None:
        """Check every architecture field; raise `ValueError` naming the first bad one."""
        for name in (
            "vocab_size",
            "hidden_size",
            "num_hidden_layers",
            "num_attention_heads",
            "head_dim",
            "intermediate_size",
            "max_position_embeddings",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        for name in ("hidden_dropout_prob", "attention_probs_dropout_prob"):
            value = getattr(self, name)
            if not 0.0 <= value < 1.0:
                raise ValueError(f"{name} must be in [0, 1), got {value!r}")
        for name in ("layer_norm_eps", "rms_norm_eps", "initializer_range"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)!r}")
        choices = {
            "hidden_act": sorted(ACT2FN),
            "position_embedding_type": list(POSITION_EMBEDDING_TYPES),
            "norm_type": list(NORM_CLASSES),
            "norm_position": list(NORM_POSITIONS),
        }
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name}={getattr(self, name)!r} is not supported; choose one of {allowed}")
        for name in ("pad_token_id", "bos_token_id"):
            value = getattr(self, name)
            if value is not None and not 0 <= value < self.vocab_size:
                raise ValueError(f"{name}={value} is outside the vocabulary [0, {self.vocab_size})")
        self._validate_embeddings()

    def _validate_embeddings(self) -> None:
        """Check `embedding_size`, `num_softmaxes` and `block_sharing` (and what block sharing contradicts)."""
        if self.embedding_size is not None and (not isinstance(self.embedding_size, int) or self.embedding_size < 1):
            raise ValueError(f"embedding_size must be None or a positive integer, got {self.embedding_size!r}")
        if not isinstance(self.num_softmaxes, int) or self.num_softmaxes < 1:
            raise ValueError(f"num_softmaxes must be a positive integer, got {self.num_softmaxes!r}")
        allowed = list(BLOCK_SHARING)
        if not getattr(self, "is_encoder_decoder", False):
            allowed = [choice for choice in allowed if choice not in ("encoder", "decoder")]
        if self.block_sharing not in allowed:
            raise ValueError(
                f"block_sharing={self.block_sharing!r} is not supported by {self.model_type}; choose one of {allowed}"
            )
        # One set of layer parameters cannot also differ between layers.
        per_layer_bias = self.position_embedding_type == "relative_attention_bias" and not getattr(
            self, "share_relative_attention_bias", True
        )
        if self.block_sharing != "none" and per_layer_bias:
            raise ValueError(
                f"block_sharing={self.block_sharing!r} shares one layer's parameters across layers, which "
                "contradicts share_relative_attention_bias=False (one bias table per layer); "
                "use share_relative_attention_bias=True or block_sharing='none'"
            )
        interval = getattr(self, "moe_layer_interval", 1)
        if self.block_sharing != "none" and getattr(self, "num_experts", 0) > 0 and interval > 1:
            raise ValueError(
                f"block_sharing={self.block_sharing!r} shares one layer's parameters across layers, which "
                f"contradicts experts on every {interval}-th layer only (num_experts={self.num_experts}, "
                f"moe_layer_interval={interval}); use moe_layer_interval=1 or block_sharing='none'"
            )
