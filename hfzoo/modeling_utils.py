"""The `PreTrainedModel` base shared by the three hfzoo families, and the outputs transformers lacks."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from transformers import PreTrainedModel
from transformers import initialization as init
from transformers.modeling_outputs import MaskedLMOutput, Seq2SeqMoEOutput
from transformers.utils.output_capturing import OutputRecorder

from .configuration_utils import HfzooConfig
from .modules.attention import HfzooAttention
from .modules.experts import HfzooRouter
from .modules.layer import HfzooLayer, Residual
from .modules.positions import POSITION_ATTENTION_BACKENDS


class HfzooPreTrainedModel(PreTrainedModel):
    """Base class of every hfzoo model: weight initialisation, backends, gradient checkpointing.

    Weights are initialised by transformers' default `_init_weights` (normal(0, `initializer_range`)
    for linear and embedding matrices, zero biases, unit norm weights), plus the residual schemes:
    ReZero's scalars start at 0, Fixup's multipliers at 1 and biases at 0, and DeepNorm / Fixup rescale
    the residual branches (`hfzoo.modules.layer.Residual.mark_branch_init`). transformers applies
    `_init_weights` only to modules that `from_pretrained` did not load, and every write goes through
    `transformers.initialization`, which skips loaded tensors, so loaded weights are never overwritten.
    With `scale_attention_scores=False` (T5), `q_proj` is drawn with standard deviation
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
    _can_record_outputs = {
        "hidden_states": HfzooLayer,
        "attentions": HfzooAttention,
        "router_logits": OutputRecorder(HfzooRouter, index=0),
    }

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

    def _init_weights(self, module: nn.Module) -> None:
        """Initialise `module`'s own tensors (transformers calls this only on modules with tensors to initialise)."""
        scale = getattr(module, "residual_init_scale", None)
        if scale is not None:  # a residual-branch projection rescaled by DeepNorm or Fixup
            if scale == 0:
                init.zeros_(module.weight)
            else:
                init.normal_(module.weight, mean=0.0, std=self.config.initializer_range * scale)
            if module.bias is not None:
                init.zeros_(module.bias)
            return
        super()._init_weights(module)
        scale = getattr(module, "init_std_scale", None)
        if scale is not None:  # q_proj with scale_attention_scores=False (T5): head_dim ** -0.5
            init.normal_(module.weight, mean=0.0, std=self.config.initializer_range * scale)
        if isinstance(module, Residual):  # ReZero / Fixup scalars
            module.init_scalars()


@dataclass
class MoeMaskedLMOutput(MaskedLMOutput):
    """`MaskedLMOutput` plus the mixture-of-experts fields of transformers' `MoeCausalLMOutputWithPast`.

    Args:
        aux_loss: float32 scalar, the experts' auxiliary loss included in `loss`
            (`hfzoo.modules.experts.router_aux_losses`), or None for a dense model.
        router_logits: one `(batch_size * seq_len, num_experts)` tensor per MoE layer, when
            `output_router_logits`.
    """

    aux_loss: torch.FloatTensor | None = None
    router_logits: tuple[torch.FloatTensor, ...] | None = None


@dataclass
class Seq2SeqMoELMOutput(Seq2SeqMoEOutput):
    """transformers' `Seq2SeqMoEOutput` (Switch Transformers) plus `aux_loss`, the total auxiliary loss in `loss`.

    `encoder_aux_loss` / `decoder_aux_loss` are each stack's load-balancing loss and `encoder_z_loss` /
    `decoder_z_loss` its router z-loss (unweighted, averaged over the stack's MoE layers);
    `aux_loss = router_aux_loss_coef * (encoder_aux_loss + decoder_aux_loss) + router_z_loss_coef *
    (encoder_z_loss + decoder_z_loss)`, as transformers' `SwitchTransformersForConditionalGeneration` adds them.

    Args:
        aux_loss: float32 scalar, or None for a dense model.
    """

    aux_loss: torch.FloatTensor | None = None
