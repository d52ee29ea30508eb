"""The `PreTrainedModel` base shared by the three hfzoo families."""

from __future__ import annotations

from transformers import PreTrainedModel

from .configuration_utils import HfzooConfig
from .modules.attention import HfzooAttention
from .modules.layer import HfzooLayer


class HfzooPreTrainedModel(PreTrainedModel):
    """Base class of every hfzoo model: weight initialisation, backends, gradient checkpointing.

    Weights are initialised by transformers' default `_init_weights` (normal(0, `initializer_range`)
    for linear and embedding matrices, zero biases, unit norm weights); transformers applies it only
    to tensors that `from_pretrained` did not load, so loaded weights are never overwritten.
    """

    config_class = HfzooConfig
    config: HfzooConfig
    base_model_prefix = "model"
    supports_gradient_checkpointing = True
    _no_split_modules = ["HfzooLayer"]
    _skip_keys_device_placement = ["past_key_values"]
    _supports_sdpa = True
    _supports_flash_attn = True
    _supports_flex_attn = True
    _supports_attention_backend = True
    _can_record_outputs = {"hidden_states": HfzooLayer, "attentions": HfzooAttention}

    def get_expanded_tied_weights_keys(self, all_submodels: bool = False) -> dict:
        """The `{target: source}` parameter ties of this model (and with `all_submodels`, of its submodels).

        hfzoo models compute `_tied_weights_keys` from their config (`tie_word_embeddings`,
        `tie_encoder_decoder_embeddings`, `block_sharing`, `embedding_size`), already expanded to
        parameter names, so transformers' gate "no ties at all unless `tie_word_embeddings`" is skipped:
        an untied LM head must not untie block-shared layers or the encoder-decoder's shared inputs.
        """
        if all_submodels:
            return super().get_expanded_tied_weights_keys(all_submodels=True)
        return dict(self._tied_weights_keys or {})
