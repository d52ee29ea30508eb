"""The `PreTrainedModel` base shared by the three hfzoo families, and the outputs transformers lacks."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
from torch import nn
from transformers import PreTrainedModel
from transformers import initialization as init
from transformers.modeling_outputs import (
    MaskedLMOutput,
    Seq2SeqMoEOutput,
    Seq2SeqSequenceClassifierOutput,
    SequenceClassifierOutput,
    SequenceClassifierOutputWithPast,
    TokenClassifierOutput,
)
from transformers.utils.output_capturing import OutputRecorder

from .configuration_utils import HfzooConfig
from .integrity import check_weight_files
from .modules.attention import HfzooAttention
from .modules.experts import HfzooRouter, router_aux_losses, token_padding_mask
from .modules.layer import Residual
from .modules.mixers import TOKEN_MIXERS
from .modules.positions import POSITION_ATTENTION_BACKENDS
from .modules.stack import LAYER_STACKS, LAYER_TYPES
from .modules.universal import UniversalTransformerLayerStack


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
    A module that owns bare `nn.Parameter`s (a convolution kernel, a synthesizer's mixing weight) defines
    `init_parameters(initializer_range)`, which `_init_weights` calls.
    A module with tensors of its own beyond those (the memory's keys and values, the branch weights of
    branched attention, the halting unit's bias) initialises them in its method `init_module_weights(config)`.

    Which attention backends a model supports depends on its `position_embedding_type`
    (`hfzoo.modules.positions.POSITION_ATTENTION_BACKENDS`) and its token mixers
    (`hfzoo.modules.mixers.TokenMixer.attention_backends`): transformers then falls back from SDPA to
    eager by default, and refuses an explicitly requested backend the model cannot use.
    """

    config_class = HfzooConfig
    config: HfzooConfig
    base_model_prefix = "model"
    supports_gradient_checkpointing = True
    _no_split_modules = [cls.__name__ for cls in LAYER_TYPES.values()]
    _skip_keys_device_placement = ["past_key_values"]
    _supports_attention_backend = True
    _can_record_outputs = {
        "hidden_states": list(LAYER_TYPES.values()),  # HfzooLayer, or another layer type's class
        "attentions": HfzooAttention,
        "router_logits": OutputRecorder(HfzooRouter, index=0),
        "ponder_cost": OutputRecorder(UniversalTransformerLayerStack, index=1),
    }

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *model_args, **kwargs):
        """`PreTrainedModel.from_pretrained`, after checking a local folder's weight files (headers and sizes).

        Raises:
            hfzoo.integrity.WeightFileError: a weight file is truncated or corrupt (the message names it);
                safetensors' own error names no file.
        """
        if pretrained_model_name_or_path is not None and os.path.isdir(pretrained_model_name_or_path):
            check_weight_files(pretrained_model_name_or_path, kwargs.get("subfolder") or "")
        return super().from_pretrained(pretrained_model_name_or_path, *model_args, **kwargs)

    def _supports_backend(self, backend: str) -> bool:
        """Whether the position scheme and every stack's token mixer support the attention `backend`."""
        if backend not in POSITION_ATTENTION_BACKENDS[self.config.position_embedding_type]:
            return False
        mixers = [TOKEN_MIXERS[layout.token_mixer] for layout in self.config.stack_layouts()]
        return all(mixer.attention_backends is None or backend in mixer.attention_backends for mixer in mixers)

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

    def _request_router_logits(self, kwargs: dict) -> bool:
        """Prepare a head's call of its base model for the auxiliary losses (every head, every family).

        Pops the caller's `output_router_logits` (default `config.output_router_logits`) from `kwargs` and,
        when the model has experts, asks the base model for the routers' logits, which the losses need; asks
        for the layer stacks' extra outputs the losses need (`LayerStack.extra_output`: the Universal
        Transformer's ACT ponder cost).

        Args:
            kwargs: the head's `**kwargs`, changed in place before they are passed to the base model.

        Returns:
            Whether the head returns the routers' logits in its output.
        """
        requested = kwargs.pop("output_router_logits", self.config.output_router_logits)
        for layout in self.config.stack_layouts():
            extra = LAYER_STACKS[layout.layer_stack].extra_output
            if extra is not None:
                kwargs[f"output_{extra}"] = True
        if self.config.num_experts == 0:
            return False
        kwargs["output_router_logits"] = True
        return bool(requested)

    def _add_router_losses(
        self,
        loss: torch.Tensor | None,
        outputs,
        attention_mask: torch.Tensor | None,
        decoder_attention_mask: torch.Tensor | None = None,
        return_router_logits: bool = False,
    ) -> tuple[torch.Tensor | None, dict]:
        """Add the auxiliary losses to a head's loss; the fields they add to the head's output.

        Each stack's experts' loss is `router_aux_losses` of its MoE layers (padding excluded); the total
        `aux_loss` sums the stacks, as transformers' `SwitchTransformersForConditionalGeneration` does, plus
        `act_loss_coef` times the Universal Transformer's ponder costs (`ponder_cost` of each stack that
        recorded one, tensor2tensor's `act_loss`). A model with neither gets `(loss, {})`.

        Args:
            loss: the head's task loss (scalar), or None without labels.
            outputs: the base model's output after `_request_router_logits`: `router_logits` (and
                `last_hidden_state`) for a single stack; `encoder_router_logits` / `decoder_router_logits`
                (and `encoder_last_hidden_state`) for the encoder-decoder.
            attention_mask: `(batch_size, seq_len)` padding mask of the (encoder) input, or None.
            decoder_attention_mask: `(batch_size, tgt_len)` padding mask of the decoder input, or None.
            return_router_logits: also return the routers' logits (`_request_router_logits`'s answer).
                The outputs' `ponder_cost` (single stack) or `encoder_ponder_cost` / `decoder_ponder_cost`
                (encoder-decoder) hold the Universal Transformer's ponder costs, when recorded.

        Returns:
            `(loss + aux_loss, fields)`; `fields` holds `aux_loss` (float32 scalar), for the encoder-decoder
            each stack's `{side}_aux_loss` / `{side}_z_loss` (load balancing and z-loss, unweighted; a stack
            that did not run, e.g. the encoder when `encoder_outputs` are given, has None), and with
            `return_router_logits` the `router_logits` (or `{side}_router_logits`).
        """
        ponder_costs = [
            cost
            for key in ("ponder_cost", "encoder_ponder_cost", "decoder_ponder_cost")
            for cost in (outputs.get(key) or ())
        ]
        ponder_loss = self.config.act_loss_coef * sum(cost.float() for cost in ponder_costs) if ponder_costs else None
        if self.config.num_experts == 0:
            if ponder_loss is None:
                return loss, {}
            return (None if loss is None else loss + ponder_loss.to(loss.device)), {"aux_loss": ponder_loss}
        if self.config.is_encoder_decoder:
            stacks = {
                "encoder_": (outputs.encoder_router_logits, attention_mask, outputs.encoder_last_hidden_state),
                "decoder_": (outputs.decoder_router_logits, decoder_attention_mask, outputs.last_hidden_state),
            }
        else:
            stacks = {"": (outputs.get("router_logits"), attention_mask, outputs.last_hidden_state)}
        fields = {}
        aux_loss = torch.zeros((), device=outputs.last_hidden_state.device)
        for side, (router_logits, mask, hidden_states) in stacks.items():
            if return_router_logits:
                fields[f"{side}router_logits"] = router_logits
            if not router_logits:  # no MoE layer in this stack, or the stack did not run
                continue
            padding_mask = token_padding_mask(mask, hidden_states.shape[1])
            stack_aux, balance, z = router_aux_losses(router_logits, self.config, padding_mask)
            aux_loss = aux_loss + stack_aux
            if side:
                fields[f"{side}aux_loss"], fields[f"{side}z_loss"] = balance, z
        if ponder_loss is not None:
            aux_loss = aux_loss + ponder_loss.to(aux_loss.device)
        fields["aux_loss"] = aux_loss
        return (None if loss is None else loss + aux_loss.to(loss.device)), fields

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
        init_module_weights = getattr(module, "init_module_weights", None)
        if init_module_weights is not None:  # a module's own tensors (memory keys, branch weights, halting bias)
            init_module_weights(self.config)
        if isinstance(module, Residual):  # ReZero / Fixup scalars
            module.init_scalars()
        elif hasattr(module, "init_parameters"):  # a block's own nn.Parameters (e.g. a convolution kernel)
            module.init_parameters(self.config.initializer_range)


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


@dataclass
class MoeSequenceClassifierOutput(SequenceClassifierOutput):
    """`SequenceClassifierOutput` plus the mixture-of-experts fields (as `MoeMaskedLMOutput`).

    Args:
        aux_loss: float32 scalar included in `loss`, or None for a dense model.
        router_logits: one `(batch_size * seq_len, num_experts)` tensor per MoE layer, when `output_router_logits`.
    """

    aux_loss: torch.FloatTensor | None = None
    router_logits: tuple[torch.FloatTensor, ...] | None = None


@dataclass
class MoeSequenceClassifierOutputWithPast(SequenceClassifierOutputWithPast):
    """`SequenceClassifierOutputWithPast` (transformers' decoder classifiers) plus the mixture-of-experts fields.

    Args:
        aux_loss: float32 scalar included in `loss`, or None for a dense model.
        router_logits: one `(batch_size * seq_len, num_experts)` tensor per MoE layer, when `output_router_logits`.
    """

    aux_loss: torch.FloatTensor | None = None
    router_logits: tuple[torch.FloatTensor, ...] | None = None


@dataclass
class MoeTokenClassifierOutput(TokenClassifierOutput):
    """`TokenClassifierOutput` plus the mixture-of-experts fields (as `MoeMaskedLMOutput`).

    Args:
        aux_loss: float32 scalar included in `loss`, or None for a dense model.
        router_logits: one `(batch_size * seq_len, num_experts)` tensor per MoE layer, when `output_router_logits`.
    """

    aux_loss: torch.FloatTensor | None = None
    router_logits: tuple[torch.FloatTensor, ...] | None = None


@dataclass
class Seq2SeqMoESequenceClassifierOutput(Seq2SeqSequenceClassifierOutput):
    """`Seq2SeqSequenceClassifierOutput` plus the mixture-of-experts fields of `Seq2SeqMoELMOutput`.

    Args:
        aux_loss: float32 scalar included in `loss`, or None for a dense model.
        encoder_aux_loss, decoder_aux_loss: each stack's load-balancing loss (unweighted), or None.
        encoder_z_loss, decoder_z_loss: each stack's router z-loss (unweighted), or None.
        encoder_router_logits, decoder_router_logits: one `(batch_size * seq_len, num_experts)` tensor per
            MoE layer of the stack, when `output_router_logits`.
    """

    aux_loss: torch.FloatTensor | None = None
    encoder_aux_loss: torch.FloatTensor | None = None
    decoder_aux_loss: torch.FloatTensor | None = None
    encoder_z_loss: torch.FloatTensor | None = None
    decoder_z_loss: torch.FloatTensor | None = None
    encoder_router_logits: tuple[torch.FloatTensor, ...] | None = None
    decoder_router_logits: tuple[torch.FloatTensor, ...] | None = None
