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
            sin/cos encodings of Vaswani et al. 2017; `none`: no position information;
            `relative_attention_bias`: T5's learned bucketed bias on the attention scores, Raffel et al.
            2020 §2.1; `shaw`: relative position representations on keys and values with clipped
            distances, Shaw et al. 2018 (eager attention only); `rotary`: rotary embeddings of queries
            and keys, Su et al. 2021; `alibi`: fixed linear distance biases per head, Press et al. 2022).
            The backends each supports are in `hfzoo.modules.positions.POSITION_ATTENTION_BACKENDS`.
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
        tie_word_embeddings: share the input embedding matrix with the output projection.
        use_cache: return key/value caches from the forward pass (generation).
        gated_mlp: gated feed-forward `down_proj(act(gate_proj(x)) * up_proj(x))` (the GLU family,
            Dauphin et al. 2017, Shazeer 2020; GeGLU with `hidden_act="gelu_new"` is T5 v1.1's).
        relative_attention_num_buckets: buckets of the T5 relative bias (`relative_attention_bias`
            only; at least 4).
        relative_attention_max_distance: distance (tokens) from which the T5 bias uses a single bucket
            (`relative_attention_bias` only; more than `relative_attention_num_buckets // 2`).
        share_relative_attention_bias: one T5 bias table per stack, shared by its layers, as T5 (True), or
            one per layer (False): Narang et al. 2021's "relative attention with shared bias" / "with bias".
        max_relative_positions: Shaw et al.'s clipping distance k (`shaw` only): 2k + 1 learned key and
            value vectors per layer.
        rope_theta: base of the rotary angles (`rotary` only).
        scale_attention_scores: multiply attention scores by `head_dim ** -0.5` (Vaswani et al. 2017,
            eq. 1). False is T5 (Mesh TensorFlow), which folds that factor into the initialisation: hfzoo
            then draws `q_proj` with standard deviation `initializer_range * head_dim ** -0.5`.
        scale_lm_head_input: multiply the final hidden states by `hidden_size ** -0.5` right before the
            vocabulary projection of the language-model head, as T5 v1.0 (Mesh TensorFlow) does with its
            tied embeddings (transformers' T5 calls it `scale_decoder_outputs`).
        pad_token_id, bos_token_id, eos_token_id: special token ids (or None).

    Raises:
        huggingface_hub.errors.StrictDataclassClassValidationError: a field has a value outside its
            allowed set or range; the message names the field.
        ValueError: `hidden_size` not divisible by `num_attention_heads` when `head_dim` is not set; a
            position field set (to a non-default value) for a scheme that is not selected, e.g.
            `rope_theta` with `position_embedding_type="alibi"`; `rotary` with an odd `head_dim`.
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
    # --- feed-forward (issue 4; minimal gated branch for T5 v1.1, the "ffn-norms" helper owns this field)
    gated_mlp: bool = False
    # --- positions and attention (issue 4)
    relative_attention_num_buckets: int = 32
    relative_attention_max_distance: int = 128
    share_relative_attention_bias: bool = True
    max_relative_positions: int = 16
    rope_theta: float | int = 10000.0
    scale_attention_scores: bool = True
    scale_lm_head_input: bool = False

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
        self._validate_positions()

    def _validate_positions(self) -> None:
        """Check the position / attention fields and their combinations; raise `ValueError` naming the field."""
        kind = self.position_embedding_type
        for name in ("relative_attention_num_buckets", "relative_attention_max_distance", "max_relative_positions"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        for name in ("share_relative_attention_bias", "scale_attention_scores", "scale_lm_head_input"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be True or False, got {getattr(self, name)!r}")
        if self.rope_theta <= 0:
            raise ValueError(f"rope_theta must be positive, got {self.rope_theta!r}")
        if self.relative_attention_num_buckets < 4:
            raise ValueError(
                f"relative_attention_num_buckets={self.relative_attention_num_buckets} is too small: T5's bucketing "
                "needs at least 4 (exact and logarithmic buckets, per direction in the encoder)"
            )
        if self.relative_attention_max_distance <= self.relative_attention_num_buckets // 2:
            raise ValueError(
                f"relative_attention_max_distance={self.relative_attention_max_distance} must exceed "
                f"relative_attention_num_buckets // 2 = {self.relative_attention_num_buckets // 2} (the exact buckets)"
            )
        if kind == "rotary" and self.head_dim % 2:
            raise ValueError(
                f"position_embedding_type='rotary' needs an even head_dim (it rotates feature pairs), "
                f"got head_dim={self.head_dim}"
            )
        # A field of a scheme that is not selected would be a silent no-op: refuse non-default values.
        fields_of_scheme = {
            "relative_attention_num_buckets": ("relative_attention_bias", 32),
            "relative_attention_max_distance": ("relative_attention_bias", 128),
            "share_relative_attention_bias": ("relative_attention_bias", True),
            "max_relative_positions": ("shaw", 16),
            "rope_theta": ("rotary", 10000.0),
        }
        for name, (scheme, default) in fields_of_scheme.items():
            if kind != scheme and getattr(self, name) != default:
                raise ValueError(
                    f"{name}={getattr(self, name)!r} only applies to position_embedding_type={scheme!r}, but "
                    f"position_embedding_type={kind!r}; leave it at its default {default!r}"
                )
