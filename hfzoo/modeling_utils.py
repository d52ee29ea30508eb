"""The `PreTrainedModel` base shared by the three hfzoo families."""

from __future__ import annotations

from transformers import PreTrainedModel
from transformers import initialization as init

from .configuration_utils import HfzooConfig
from .modules.attention import HfzooAttention
from .modules.layer import HfzooLayer
from .modules.positions import POSITION_ATTENTION_BACKENDS


class HfzooPreTrainedModel(PreTrainedModel):
    """Base class of every hfzoo model: weight initialisation, backends, gradient checkpointing.

    Weights are initialised by transformers' default `_init_weights` (normal(0, `initializer_range`)
    for linear and embedding matrices, zero biases, unit norm weights); transformers applies it only
    to tensors that `from_pretrained` did not load, so loaded weights are never overwritten. With
    `scale_attention_scores=False` (T5), `q_proj` is drawn with standard deviation
    `initializer_range * head_dim ** -0.5`: the score scaling moves into the initialisation, so
    attention starts out as in a scaled model (Mesh TensorFlow's T5 initialisation does the same).

    Which attention backends a model supports depends on its `position_embedding_type`
    (`hfzoo.modules.positions.POSITION_ATTENTION_BACKENDS`): transformers then falls back from SDPA to
    eager by default, and refuses an explicitly requested backend the scheme cannot use.
    """

    config_class = HfzooConfig
    config: HfzooConfig
    base_model_prefix = "model"
    supports_gradient_checkpointing = True
    _no_split_modules = ["HfzooLayer"]
    _skip_keys_device_placement = ["past_key_values"]
    _supports_attention_backend = True
    _can_record_outputs = {"hidden_states": HfzooLayer, "attentions": HfzooAttention}

    def _supports_backend(self, backend: str) -> bool:
        return backend in POSITION_ATTENTION_BACKENDS[self.config.position_embedding_type]

    @property
    def _supports_sdpa(self) -> bool:
        return self._supports_backend("sdpa")

    @property
    def _supports_flash_attn(self) -> bool:
        return self._supports_backend("flash_attention")

    @property
    def _supports_flex_attn(self) -> bool:
        return self._supports_backend("flex_attention")

    def _init_weights(self, module) -> None:
        """Apply transformers' default initialisation, then a module's own `init_std_scale` factor, if it has one.

        `HfzooAttention` gives its `q_proj` the factor `head_dim ** -0.5` when `scale_attention_scores=False`.
        (transformers skips parameter-less containers such as the attention module itself for custom
        code, so the factor is set on the linear layer.)
        """
        super()._init_weights(module)
        scale = getattr(module, "init_std_scale", None)
        if scale is not None:
            init.normal_(module.weight, mean=0.0, std=self.config.initializer_range * scale)
