"""The `PreTrainedModel` base shared by the three hfzoo families, and the outputs transformers lacks."""

from __future__ import annotations

import functools
import inspect
import os
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from transformers import PreTrainedModel
from transformers import initialization as init
from transformers.cache_utils import Cache, EncoderDecoderCache
from transformers.generation import GenerationMixin
from transformers.loss.loss_utils import ForMaskedLMLoss, ForSequenceClassificationLoss
from transformers.modeling_outputs import (
    MaskedLMOutput,
    QuestionAnsweringModelOutput,
    Seq2SeqMoEOutput,
    Seq2SeqQuestionAnsweringModelOutput,
    Seq2SeqSequenceClassifierOutput,
    SequenceClassifierOutput,
    SequenceClassifierOutputWithPast,
    TokenClassifierOutput,
)
from transformers.modeling_utils import slice_logits_to_keep
from transformers.utils.output_capturing import OutputRecorder

from .compat import CACHE_NAME, LEGACY_CACHE_NAME, accept_legacy_cache_name, cache_field, output_cache, peft_cache_name
from .configuration_utils import HfzooConfig
from .integrity import check_weight_files
from .modules.attention import HfzooAttention, has_fused_qkv_projections, key_value_heads
from .modules.embeddings import (
    AdaptiveLogSoftmax,
    AdaptiveVocabProjection,
    TokenEmbedding,
    VocabProjection,
    check_lm_labels,
    check_vocab_resizable,
)
from .modules.experts import HfzooRouter, router_aux_losses, token_padding_mask
from .modules.layer import HfzooLayer, Residual
from .modules.mixers import TOKEN_MIXERS
from .modules.positions import POSITION_ATTENTION_BACKENDS
from .modules.softcapping import supports_attention_softcapping
from .modules.stack import LAYER_STACKS, LAYER_TYPES
from .modules.universal import UniversalTransformerLayerStack

#: Keyword arguments every hfzoo model's `forward` accepts besides the named parameters of its own `forward` and
#: of its base model's (a head passes its `**kwargs` on to `self.model`), and who uses them.
PASSED_DOWN_KWARGS = {
    "return_dict": "transformers' `can_return_tuple` / `capture_outputs`: a tuple instead of a `ModelOutput`",
    "output_attentions": "`capture_outputs`: return the attention probabilities (eager attention)",
    "output_hidden_states": "`capture_outputs`: return each layer's input and the final hidden states",
    "output_cross_attentions": "`capture_outputs`: return the cross-attention probabilities (encoder-decoder)",
    "output_router_logits": "heads and `capture_outputs`: return the routers' logits (experts)",
    "output_ponder_cost": "`capture_outputs`: return the Universal Transformer's ACT ponder cost",
    "num_items_in_batch": "heads: the labelled positions of the accumulated batch (transformers' `Trainer`)",
    "cu_seq_lens_q": "flash attention over packed sequences (`DataCollatorWithFlattening`)",
    "cu_seq_lens_k": "flash attention over packed sequences (`DataCollatorWithFlattening`)",
    "max_length_q": "flash attention over packed sequences (`DataCollatorWithFlattening`)",
    "max_length_k": "flash attention over packed sequences (`DataCollatorWithFlattening`)",
    LEGACY_CACHE_NAME: "the cache under its name before transformers 5.24 (renamed to `cache` on entry)",
}
#: Keyword arguments hfzoo accepts and deliberately ignores, with the reason.
IGNORED_KWARGS = {
    "cache_position": "positions follow the cache's length (`Cache.get_seq_length`), as in transformers 5's own "
    "models; callers written for transformers 4 (and PEFT's prompt learning) still send it",
}
_ACCEPTED: dict[type, frozenset[str]] = {}
#: PEFT's `peft_type` values whose prompt is a key/value prefix handed to the model as its cache.
PREFIX_PEFT_TYPES = frozenset({"PREFIX_TUNING", "CARTRIDGE"})


def accepted_keywords(model: nn.Module) -> frozenset[str]:
    """The keyword arguments `model.forward` accepts: named by it or its base model, or `PASSED_DOWN_KWARGS`.

    Besides its named parameters, a model may read keywords from its `**kwargs` that it lists in its
    `_forward_kwargs_read` (the causal LM's `shift_labels`: named, `Trainer` would take it for a label column).

    Args:
        model: an hfzoo model (a head's base model is `model.base_model`).

    Returns:
        The names, without those of `IGNORED_KWARGS` (accepted too, and dropped).
    """
    accepted = _ACCEPTED.get(type(model))
    if accepted is None:
        parameters = inspect.signature(model.forward).parameters.values()
        variadic = (inspect.Parameter.VAR_KEYWORD, inspect.Parameter.VAR_POSITIONAL)
        names = {p.name for p in parameters if p.kind not in variadic} | PASSED_DOWN_KWARGS.keys()
        names |= getattr(model, "_forward_kwargs_read", frozenset())
        base = getattr(model, "base_model", model)
        if base is not model:
            names |= accepted_keywords(base)
        accepted = _ACCEPTED[type(model)] = frozenset(names)
    return accepted


def forward_contract(forward: Callable) -> Callable:
    """The keyword-argument contract of every hfzoo model's `forward` (applied by `HfzooPreTrainedModel`).

    - the cache is the parameter `cache`; `past_key_values` (its name before transformers 5.24) is accepted
      as an alias (`hfzoo.compat.accept_legacy_cache_name`), passing both is refused;
    - a keyword that is not accepted (`accepted_keywords`: named here or by the base model, or in
      `PASSED_DOWN_KWARGS`) nor in `IGNORED_KWARGS` raises `TypeError` naming it, instead of disappearing
      into `**kwargs` (a misspelt `cahce=` would otherwise decode without its context); the ones in
      `IGNORED_KWARGS` are dropped.

    Args:
        forward: a model's `forward`.

    Returns:
        The wrapped method; `inspect.signature` reports the original parameters, plus `past_key_values` where
        `forward` names `cache`.

    Raises:
        TypeError: (from the wrapped method) an unknown keyword argument.
        ValueError: (from the wrapped method) both `cache` and `past_key_values`.
    """
    parameters = inspect.signature(forward).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        unchecked = forward

        @functools.wraps(unchecked)
        def forward(self, *args, **kwargs):
            if not torch.compiler.is_compiling():
                for name in kwargs.keys() - accepted_keywords(self):
                    if name not in IGNORED_KWARGS:
                        raise TypeError(
                            f"{type(self).__name__}.forward() got an unexpected keyword argument {name!r} (besides "
                            "the named parameters it takes those of hfzoo.modeling_utils.PASSED_DOWN_KWARGS)"
                        )
                    del kwargs[name]
            return unchecked(self, *args, **kwargs)

    return accept_legacy_cache_name(forward) if "cache" in parameters else forward


def layer_wrap_classes(model: nn.Module) -> list[str]:
    """The names of the layer classes (`LAYER_TYPES`) among `model`'s modules: its units for FSDP2 and `device_map`.

    Each layer is a unit of FSDP2's transformer auto-wrapping (Zhao et al. 2023, "PyTorch FSDP", arXiv:2304.11277):
    its parameters are gathered for its forward and backward and freed after. Only the classes present are
    named (`HfzooLayer`, or the Evolved Transformer's `EvolvedTransformerLayer`), since accelerate refuses a
    name no module has. Layers that share parameters (block sharing, the Universal
    Transformer's steps: ties made by `tie_weights`) cannot be separate units, since one parameter would be
    sharded twice (the stacks' `layer_sources` or shared parameter objects tell): then the list is
    empty and the model is sharded as one unit.

    Args:
        model: a built model.

    Returns:
        Class names, sorted; `[]` when a parameter of a layer is also used by another module.
    """
    layer_types = tuple(LAYER_TYPES.values())
    layers = {
        name: type(m).__name__ for name, m in model.named_modules(remove_duplicate=False) if isinstance(m, layer_types)
    }
    units: dict[int, set[str | None]] = {}  # parameter -> the layers using it (None: a module outside every layer)
    for name, param in model.named_parameters(remove_duplicate=False):
        prefixes = [prefix for prefix in layers if name.startswith(prefix + ".")]
        units.setdefault(id(param), set()).add(max(prefixes, key=len) if prefixes else None)
    shared = any(len(used_by) > 1 and used_by & set(layers) for used_by in units.values())
    # Before `tie_weights` runs, the stacks' `layer_sources` tell which layers will share parameters.
    tied = any(
        any(source != i for i, source in enumerate(getattr(m, "layer_sources", None) or [])) for m in model.modules()
    )
    if shared or tied:
        return []
    return sorted(set(layers.values()))


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

    Losses follow transformers' `Trainer` contract (`accepts_loss_kwargs = True` on every head): a head
    given `num_items_in_batch` (the labelled positions of the whole accumulated batch, counted as Trainer
    counts them) returns the summed loss of its micro-batch divided by it, so gradient accumulation adds up
    to the loss of the whole batch; without it, the mean over this batch. The experts' auxiliary loss is then
    weighted by the micro-batch's share of those positions (`_add_router_losses`). The bare models (no
    loss) declare `accepts_loss_kwargs = False`.

    Every subclass's `forward` follows one keyword contract (`forward_contract`): the cache is `cache`, also
    accepted as `past_key_values` (its name before transformers 5.24); outputs carry it under the installed
    release's field name; a keyword argument that is not used, passed down (`PASSED_DOWN_KWARGS`) or
    deliberately ignored (`IGNORED_KWARGS`) raises `TypeError`.

    `resize_token_embeddings` resizes every vocabulary matrix (the encoder-decoder's untied decoder input
    embeddings included) and keeps hfzoo's embedding and head modules (factorized, scaled, mixture of
    softmaxes); a model holding a module that cannot resize refuses (`check_vocab_resizable`).
    """

    config_class = HfzooConfig
    config: HfzooConfig
    base_model_prefix = "model"
    accepts_loss_kwargs = True
    supports_gradient_checkpointing = True
    _no_split_modules = [cls.__name__ for cls in LAYER_TYPES.values()]  # per model: `post_init`
    _skip_keys_device_placement = [CACHE_NAME]
    _supports_attention_backend = True
    _forward_kwargs_read: frozenset[str] = frozenset()  # keywords `forward` reads from its **kwargs (see above)
    _can_record_outputs = {
        "hidden_states": list(LAYER_TYPES.values()),  # HfzooLayer, or another layer type's class
        "attentions": HfzooAttention,
        "router_logits": OutputRecorder(HfzooRouter, index=0),
        "ponder_cost": OutputRecorder(UniversalTransformerLayerStack, index=1),
    }

    def post_init(self):
        """Transformers' `post_init`, after setting `_no_split_modules` to the model's FSDP2 units.

        The units are `layer_wrap_classes(self)`.

        accelerate's FSDP2 auto-wrapping (`fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP`) shards each module of a
        class named in `_no_split_modules` as one unit and refuses a name that no module of the model has, so the
        list names the layer classes this model holds rather than every layer type.
        """
        units = layer_wrap_classes(self)
        self._no_split_modules = units
        # What every head's forward asks of the config, read once: a config attribute costs a Python call
        # (`PreTrainedConfig.__getattribute__`), and under torch.compile a guard checked at every call.
        self._has_experts = self.config.num_experts > 0
        self._layer_stack_outputs = tuple(
            f"output_{extra}"
            for layout in self.config.stack_layouts()
            if (extra := LAYER_STACKS[layout.layer_stack].extra_output) is not None
        )
        super().post_init()
        self._no_split_modules = set(units)  # not the union with the submodels' (a stack of untied layers)

    def __init_subclass__(cls, **kwargs):
        """Give the `forward` a subclass defines the keyword contract of every hfzoo model (`forward_contract`)."""
        super().__init_subclass__(**kwargs)
        forward = cls.__dict__.get("forward")
        if forward is not None:
            cls.forward = forward_contract(forward)

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *model_args, **kwargs):
        """`PreTrainedModel.from_pretrained`, after checking a local folder's weight files (headers and sizes).

        Raises:
            hfzoo.integrity.WeightFileError: a weight file is truncated or corrupt (the message names it);
                safetensors' own error names no file.
        """
        if pretrained_model_name_or_path is not None and os.path.isdir(pretrained_model_name_or_path):
            check_weight_files(pretrained_model_name_or_path, kwargs.get("subfolder") or "")
        loaded = super().from_pretrained(pretrained_model_name_or_path, *model_args, **kwargs)
        _align_cpu_tensors(loaded[0] if isinstance(loaded, tuple) else loaded)
        return loaded

    def fuse_qkv_projections(self) -> int:
        """Give every self-attention one query-key-value projection `qkv_proj`, for inference.

        `HfzooAttention.fuse_qkv_projections` on each self-attention module: one matrix product per layer instead
        of three, and fewer parameter tensors for a compiled decoding step to guard, as in GPT-2's `c_attn` (the
        same outputs up to rounding). Undone by `unfuse_qkv_projections`; a fused model is not saved
        (`save_pretrained` refuses) and its PEFT `target_modules` `q_proj`, `k_proj`, `v_proj` are gone.

        Returns:
            The number of attention modules fused now.

        Raises:
            ValueError: a projection wrapped by an adapter (merge it first).
        """
        attentions = [m for m in self.modules() if isinstance(m, HfzooAttention)]
        return sum(attention.fuse_qkv_projections() for attention in attentions)

    def unfuse_qkv_projections(self) -> int:
        """Undo `fuse_qkv_projections`: separate `q_proj`, `k_proj`, `v_proj` again, with the fused weights.

        Returns:
            The number of attention modules unfused now.
        """
        attentions = [m for m in self.modules() if isinstance(m, HfzooAttention)]
        return sum(attention.unfuse_qkv_projections() for attention in attentions)

    def save_pretrained(self, save_directory, *args, **kwargs):
        """`PreTrainedModel.save_pretrained`, refusing a model whose projections are fused.

        Raises:
            ValueError: `fuse_qkv_projections` is in effect (its checkpoint would hold `qkv_proj` weights that
                no hfzoo, conversion or adapter reads); nothing is written.
        """
        if has_fused_qkv_projections(self):
            raise ValueError(
                "this model's query, key and value projections are fused (fuse_qkv_projections): call "
                "model.unfuse_qkv_projections() before save_pretrained / push_to_hub"
            )
        return super().save_pretrained(save_directory, *args, **kwargs)

    def _supports_backend(self, backend: str) -> bool:
        """Whether the position scheme, every stack's token mixer and the score soft-capping support `backend`."""
        if backend not in POSITION_ATTENTION_BACKENDS[self.config.position_embedding_type]:
            return False
        if getattr(self.config, "attn_logit_softcapping", None) is not None and not supports_attention_softcapping(
            backend
        ):  # SDPA cannot apply a tanh to the scores: transformers falls back to eager (as for Gemma 2)
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

    def _resize_token_embeddings(self, new_num_tokens, pad_to_multiple_of=None, mean_resizing=True):
        """Resize the input and output embeddings as transformers does, and every other `TokenEmbedding` of the model.

        The encoder-decoder with `tie_encoder_decoder_embeddings=False` has a second input matrix (the
        decoder's), which transformers' `get_input_embeddings` does not reach; it is resized the same way
        (rows kept, new rows initialised as transformers does). `resize_token_embeddings` re-ties afterwards.

        Raises:
            ValueError: a module of the model cannot change its vocabulary size
                (`hfzoo.modules.embeddings.check_vocab_resizable`).
        """
        check_vocab_resizable(self)
        others = {id(m): m for m in self.modules() if isinstance(m, TokenEmbedding)}
        others.pop(id(self.get_input_embeddings()), None)
        embeddings = super()._resize_token_embeddings(new_num_tokens, pad_to_multiple_of, mean_resizing)
        for module in others.values():
            requires_grad = module.weight.requires_grad
            self._get_resized_embeddings(module, embeddings.weight.shape[0], mean_resizing=mean_resizing)
            module.weight.requires_grad_(requires_grad)
        return embeddings

    def _get_resized_lm_head(self, old_lm_head, new_num_tokens=None, transposed=False, mean_resizing=True):
        """Resize the output layer as transformers does, keeping the `VocabProjection` module.

        transformers builds a plain `nn.Linear`; hfzoo's `VocabProjection` also holds the factorization, the
        input scale and the mixture of softmaxes, so only its `weight` (and `bias`) are replaced by the
        resized ones (old rows kept, new rows initialised by transformers).
        """
        resized = super()._get_resized_lm_head(old_lm_head, new_num_tokens, transposed, mean_resizing)
        if resized is old_lm_head or not isinstance(old_lm_head, VocabProjection):
            return resized
        old_lm_head.weight = resized.weight
        if old_lm_head.bias is not None:
            old_lm_head.bias = resized.bias
        old_lm_head.out_features = resized.out_features
        return old_lm_head

    @staticmethod
    def _carried(outputs, *fields: str) -> dict:
        """The fields of a base model's output that a head returns as they are.

        Args:
            outputs: the base model's `ModelOutput`.
            *fields: names of the fields to carry besides the cache (`hidden_states`, `attentions`, ...).

        Returns:
            `{field: value}`, with the cache under the installed transformers' name (`hfzoo.compat.CACHE_NAME`).
        """
        return {**cache_field(output_cache(outputs)), **{field: getattr(outputs, field) for field in fields}}

    def _chunked_loss(self, labels: torch.Tensor | None, skip_logits: bool | None) -> bool:
        """Whether a language-modelling head computes its loss from the hidden states in chunks, returning no logits.

        Args:
            labels: the head's labels, or None.
            skip_logits: the caller's choice; None: skip in training mode when labels are given.

        Returns:
            True when the logits are skipped and the output embedding computes the summed loss from `labels`
            itself: a `VocabProjection` (in chunks) or an adaptive output (`AdaptiveVocabProjection`,
            `AdaptiveLogSoftmax`, which score the whole vocabulary); a head replaced by a wrapper, e.g. PEFT's
            LoRA on `lm_head`, computes full logits and its loss from them.

        Raises:
            ValueError: `skip_logits=True` without labels.
        """
        if skip_logits is None:
            skip_logits = self.training and labels is not None
        if skip_logits and labels is None:
            raise ValueError("skip_logits=True needs labels: without them the logits are the only output")
        return bool(skip_logits) and isinstance(
            self.get_output_embeddings(), (VocabProjection, AdaptiveVocabProjection, AdaptiveLogSoftmax)
        )

    def _loss_share(self, labels: torch.Tensor | None, num_items_in_batch) -> torch.Tensor | None:
        """This micro-batch's share of the accumulated batch's labelled positions (None without `num_items_in_batch`).

        Args:
            labels: the labels the loss is computed on (after any shift), -100 = ignored.
            num_items_in_batch: the labelled positions of the whole accumulated batch (Trainer's count), or None.

        Returns:
            float32 scalar `labels.ne(-100).sum() / num_items_in_batch`, or None.
        """
        if labels is None or num_items_in_batch is None:
            return None
        return labels.ne(-100).sum().float() / _as_device_tensor(num_items_in_batch, labels.device)

    def _lm_loss(
        self,
        hidden_states: torch.Tensor,
        labels: torch.LongTensor | None,
        num_items_in_batch: int | torch.Tensor | None = None,
        skip_logits: bool | None = None,
        logits_to_keep: int | torch.Tensor = 0,
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """The logits and the token loss of a language-modelling head (every family's: masked, causal, seq2seq).

        With `_chunked_loss` the head's `lm_head` computes the summed cross-entropy from the hidden states
        itself (`lm_head(hidden_states, labels=labels)`, in chunks of tokens) and no logits are made; otherwise
        `lm_head(hidden_states)` gives the logits and the loss is transformers' token loss on them
        (`ForMaskedLMLoss`: float32 cross-entropy, no shift). Either way the loss is normalised as
        transformers' `fixed_cross_entropy` does: the sum over the labelled positions divided by
        `num_items_in_batch`, or without it the mean over `labels != -100` (NaN when every label is ignored).

        Args:
            hidden_states: `(batch_size, seq_len, hidden_size)` float final hidden states of the base model.
            labels: `(batch_size, seq_len)` int64 targets already aligned with the positions (a causal head
                passes its labels shifted: position t predicts label t + 1), -100 = ignored; or None.
            num_items_in_batch: the labelled positions of the whole accumulated batch (transformers'
                `Trainer`; int or scalar tensor), or None.
            skip_logits: the caller's choice (`_chunked_loss`); None: skip the logits in training mode with labels.
            logits_to_keep: when logits are computed, only for the last `logits_to_keep` positions (0 = all;
                transformers' `slice_logits_to_keep`, as in generation).

        Returns:
            `(logits, loss)`: `logits` `(batch_size, seq_len, vocab_size)` (or `logits_to_keep` positions) in
            the dtype of the head's output, None when chunked; `loss` a float32 scalar (nats per labelled
            position), None without labels.

        Raises:
            ValueError: labels that are not integer ids of the hidden states' `(batch_size, seq_len)`, or a label
                outside `[0, vocab_size)` other than -100 (`check_lm_labels`); `skip_logits=True` without labels
                (`_chunked_loss`), or labels that do not match the logits' positions (`logits_to_keep` with
                labels; `cross_entropy`'s check).
        """
        if labels is not None:
            check_lm_labels(labels, hidden_states.shape[:2], self.config.vocab_size)
        if self._chunked_loss(labels, skip_logits):
            summed = self.lm_head(hidden_states, labels=labels)
            return None, normalize_summed_loss(summed, labels, num_items_in_batch)
        logits = self.lm_head(slice_logits_to_keep(hidden_states, logits_to_keep))
        if labels is None:
            return logits, None
        loss = ForMaskedLMLoss(
            logits, labels.contiguous(), vocab_size=self.config.vocab_size, num_items_in_batch=num_items_in_batch
        )
        return logits, loss

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
        for output in self._layer_stack_outputs:
            kwargs[output] = True
        if not self._has_experts:
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
        loss_share: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor | None, dict]:
        """Add the auxiliary losses to a head's loss; the fields they add to the head's output.

        Each stack's experts' loss is `router_aux_losses` of its MoE layers (padding excluded); the total
        `aux_loss` sums the stacks, as transformers' `SwitchTransformersForConditionalGeneration` does, plus
        `act_loss_coef` times the Universal Transformer's ponder costs (`ponder_cost` of each stack that
        recorded one, tensor2tensor's `act_loss`). A model with neither gets `(loss, {})`.

        Under gradient accumulation (`num_items_in_batch`) the task loss of each micro-batch is already a
        share of the whole batch's loss, and adding the auxiliary loss whole to every micro-batch (as
        transformers' MoE models do) would weight it by the number of micro-batches. So it is weighted by
        `loss_share`, the micro-batch's share of the labelled positions: the shares sum to 1 over the
        accumulated batch, and the step's auxiliary loss is the share-weighted mean of the micro-batches' ones.

        Args:
            loss: the head's task loss (scalar), or None without labels.
            outputs: the base model's output after `_request_router_logits`: `router_logits` (and
                `last_hidden_state`) for a single stack (the encoder-decoder's encoder alone too);
                `encoder_router_logits` / `decoder_router_logits` (and `encoder_last_hidden_state`) for both.
            attention_mask: `(batch_size, seq_len)` padding mask of the (encoder) input, or None.
            decoder_attention_mask: `(batch_size, tgt_len)` padding mask of the decoder input, or None.
            return_router_logits: also return the routers' logits (`_request_router_logits`'s answer).
                The outputs' `ponder_cost` (single stack) or `encoder_ponder_cost` / `decoder_ponder_cost`
                (encoder-decoder) hold the Universal Transformer's ponder costs, when recorded.
            loss_share: `_loss_share` of the head's labels, or None (weight 1).

        Returns:
            `(loss + loss_share * aux_loss, fields)`; `fields` holds `aux_loss` (float32 scalar, unweighted),
            for the encoder-decoder each stack's `{side}_aux_loss` / `{side}_z_loss` (load balancing and
            z-loss, unweighted; a stack that did not run, e.g. the encoder when `encoder_outputs` are given,
            has None), and with
            `return_router_logits` the `router_logits` (or `{side}_router_logits`).
        """
        ponder_costs = [
            cost
            for key in ("ponder_cost", "encoder_ponder_cost", "decoder_ponder_cost")
            for cost in (outputs.get(key) or ())
        ]
        ponder_loss = self.config.act_loss_coef * sum(cost.float() for cost in ponder_costs) if ponder_costs else None
        if not self._has_experts:
            if ponder_loss is None:
                return loss, {}
            return (None if loss is None else loss + ponder_loss.to(loss.device)), {"aux_loss": ponder_loss}
        if hasattr(outputs, "encoder_router_logits"):  # both stacks (not the encoder-decoder's encoder alone)
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
        if loss is None:
            return None, fields
        weighted = aux_loss if loss_share is None else aux_loss * loss_share.to(aux_loss.device)
        return loss + weighted.to(loss.device), fields

    def _token_classification_output(
        self,
        logits: torch.Tensor,
        labels: torch.LongTensor | None,
        outputs,
        attention_mask: torch.Tensor | None,
        return_router_logits: bool,
        num_items_in_batch=None,
    ) -> MoeTokenClassifierOutput:
        """A token-classification head's output from its logits (the encoder's and the decoder's heads).

        The loss is transformers' `ForTokenClassification` (the mean cross-entropy over labelled positions, or
        their sum divided by `num_items_in_batch`), plus the auxiliary losses (`_add_router_losses`).

        Args:
            logits: `(batch_size, seq_len, num_labels)` scores of each token.
            labels: `(batch_size, seq_len)` int64 class ids, -100 for ignored positions; or None.
            outputs: the base model's output (`hidden_states`, `attentions`, routers' logits).
            attention_mask: `(batch_size, seq_len)` padding mask, or None.
            return_router_logits: `_request_router_logits`'s answer.
            num_items_in_batch: the labelled positions of the accumulated batch (transformers' `Trainer`), or None.

        Returns:
            `MoeTokenClassifierOutput` with `logits`, `loss` (None without labels), `hidden_states`, `attentions`
            and, with experts, `aux_loss` (included in `loss`) and the routers' logits when asked for.
        """
        loss = None
        if labels is not None:
            loss = self.loss_function(
                logits, labels.contiguous(), config=self.config, num_items_in_batch=num_items_in_batch
            )
        share = self._loss_share(labels, num_items_in_batch)
        loss, moe = self._add_router_losses(
            loss, outputs, attention_mask, return_router_logits=return_router_logits, loss_share=share
        )
        return MoeTokenClassifierOutput(
            loss=loss, logits=logits, hidden_states=outputs.hidden_states, attentions=outputs.attentions, **moe
        )

    def _question_answering_output(
        self,
        span_logits: torch.Tensor,
        start_positions: torch.LongTensor | None,
        end_positions: torch.LongTensor | None,
        outputs,
        attention_mask: torch.Tensor | None,
        return_router_logits: bool,
        num_items_in_batch=None,
        *,
        decoder_attention_mask: torch.Tensor | None = None,
        output_class: type | None = None,
        carried: dict | None = None,
    ) -> MoeQuestionAnsweringModelOutput:
        """A span-extraction head's output from its `qa_outputs` scores (the span heads of all three families).

        The loss is transformers' `ForQuestionAnsweringLoss` on float32 logits: the mean of the start and the
        end cross-entropies over the sequence, positions at or beyond `seq_len` left out; plus the auxiliary
        losses (`_add_router_losses`).

        Args:
            span_logits: `(batch_size, seq_len, 2)` start and end scores of each token.
            start_positions: `(batch_size,)` int64 token index of the answer's first token (checked by
                `hfzoo.modules.heads.check_answer_positions`), or None.
            end_positions: `(batch_size,)` int64 token index of the answer's last token, or None.
            outputs: the base model's output (`hidden_states`, `attentions`, routers' logits).
            attention_mask: `(batch_size, seq_len)` padding mask, or None.
            return_router_logits: `_request_router_logits`'s answer.
            num_items_in_batch: transformers' `Trainer` count: the summed losses are divided by it instead of
                averaged over the rows; or None.
            decoder_attention_mask: the encoder-decoder's decoder padding mask (its experts' losses), or None.
            output_class: the output class (default `MoeQuestionAnsweringModelOutput`; the encoder-decoder's
                `Seq2SeqMoEQuestionAnsweringModelOutput`).
            carried: the base model's fields the output carries (default: `hidden_states` and `attentions`).

        Returns:
            `output_class` with `start_logits` and `end_logits`, each `(batch_size, seq_len)` in the model's dtype,
            the float32 `loss` given both positions, the `carried` fields and, with experts, `aux_loss` (included
            in `loss`) and the routers' logits when asked for.
        """
        start_logits, end_logits = span_logits.unbind(dim=-1)
        start_logits, end_logits = start_logits.contiguous(), end_logits.contiguous()
        loss = None
        if start_positions is not None and end_positions is not None:
            loss = self.loss_function(
                start_logits.float(),
                end_logits.float(),
                start_positions,
                end_positions,
                num_items_in_batch=num_items_in_batch,
            )
        loss, moe = self._add_router_losses(
            loss, outputs, attention_mask, decoder_attention_mask, return_router_logits=return_router_logits
        )
        if carried is None:
            carried = {"hidden_states": outputs.hidden_states, "attentions": outputs.attentions}
        output_class = output_class or MoeQuestionAnsweringModelOutput
        return output_class(loss=loss, start_logits=start_logits, end_logits=end_logits, **carried, **moe)

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


def has_attention_cache(config) -> bool:
    """Whether every self-attention cache layer of the causal stack holds attention keys and values.

    That is, `(batch_size, num_key_value_heads, length, head_dim)` keys and values: Transformer layers whose token
    mixer is an `HfzooAttention` (sliding-window and branched attention included). The convolutions, the
    synthesizer and the Evolved Transformer's cells keep states of other shapes in theirs.
    """
    causal = [layout for layout in config.stack_layouts() if layout.is_causal]
    if not causal or LAYER_TYPES[config.layer_type] is not HfzooLayer:
        return False
    mixer = TOKEN_MIXERS[causal[-1].token_mixer].module
    return isinstance(mixer, type) and issubclass(mixer, HfzooAttention)


def early_initialize_static_cache(model: PreTrainedModel, cache: Cache | None, batch_size: int) -> None:
    """Allocate a static cache's tensors now, before a compiled forward pass first writes to them.

    transformers' `StaticLayer` allocates its keys and values at its first `update` and marks them (and its length
    counter) with `torch._dynamo.mark_static_address`, except while dynamo traces. When the prefill runs compiled
    (`model.forward = torch.compile(model.forward, mode="reduce-overhead")`, transformers' recipe), that first
    update is traced: the tensors are created inside the graph (in CUDA graph memory, which the next replay
    overwrites: "accessing tensor output of CUDAGraphs that has been overwritten by a subsequent run") and are
    never marked, so the decoding graph mutates unmarked inputs ("skipping cudagraphs due to mutated inputs", 3
    per layer: keys, values, length). Allocated here, outside the compiled region, they are static inputs, which
    CUDA graphs may update in place. transformers does this itself only for chunked prefill.

    The self-attention cache is initialised when its layers hold attention keys and values (`has_attention_cache`;
    otherwise its layers stay lazy: correct, but without CUDA graphs), the cross-attention cache of an
    `EncoderDecoderCache` always (cross-attention is attention in every hfzoo layer). Dynamic caches, layers already
    initialised and `None` are left alone.

    Args:
        model: the hfzoo model that will run on the cache (its config, dtype and device).
        cache: the cache `generate` (or the caller) hands the model, or None.
        batch_size: rows of the decoder inputs (beams included).
    """
    if cache is None:
        return
    config = model.config
    if isinstance(cache, EncoderDecoderCache):
        caches = [(cache.self_attention_cache, has_attention_cache(config)), (cache.cross_attention_cache, True)]
    else:
        caches = [(cache, has_attention_cache(config))]
    for sub_cache, attention_shaped in caches:
        layers = getattr(sub_cache, "layers", None)
        if not attention_shaped or not layers or not sub_cache.is_compileable:
            continue
        if all(layer.is_initialized or not layer.supports_early_init for layer in layers):
            continue
        sub_cache.early_initialization(
            batch_size=batch_size,
            num_heads=key_value_heads(config),  # the cache stores the key/value heads (grouped-query attention)
            head_dim=config.head_dim,
            dtype=model.dtype,
            device=model.device,
        )


class HfzooGenerationMixin(GenerationMixin):
    """transformers' `GenerationMixin` with what static-cache generation needs from an hfzoo model.

    - `create_masks_for_generate`: the 4-D mask `generate` prepares for a static cache (so that a compiled forward
      sees inputs of one shape at every step) is the stack's own (`HfzooStack.self_attention_mask`), with the token
      mixer's pattern (a local window); transformers' generic one would drop it.
    - `prepare_inputs_for_generation`: allocates a static cache before the first forward pass
      (`early_initialize_static_cache`), so that a compiled prefill does not create the cache's tensors and
      CUDA graphs can update them in place.

    A head lists it after its `PreTrainedModel` base and says which stack generates (`_generating_stack`).
    """

    def _generating_stack(self):
        """The causal `HfzooStack` whose cache `generate` extends (a head overrides it)."""
        raise NotImplementedError

    def create_masks_for_generate(
        self,
        config,
        inputs_embeds: torch.Tensor,
        attention_mask: torch.Tensor | None,
        cache: Cache | None = None,
        position_ids: torch.Tensor | None = None,
        **kwargs,
    ):
        """The generating stack's self-attention mask for the next step (`HfzooStack.self_attention_mask`).

        Called by `GenerationMixin.prepare_inputs_for_generation` when the cache is compileable (a static cache).

        Args:
            config: the model's config (unused: the stack's is the same).
            inputs_embeds: `(batch_size, q_len, 0)`: the step's batch size, length, dtype and device.
            attention_mask: `(batch_size, past_len + q_len)` decoder padding mask, or None.
            cache: the generation cache (an `EncoderDecoderCache` for the encoder-decoder); transformers before
                5.24 passes it as `past_key_values` (`LEGACY_CACHE_NAME`).
            position_ids: `(batch_size, q_len)` int64, or None.
            **kwargs: other arguments transformers passes (token types, `is_first_iteration`), unused.

        Returns:
            The backend-specific mask, as the stack would build it from the same inputs.
        """
        if cache is None:
            cache = kwargs.get(LEGACY_CACHE_NAME)
        self_cache = cache.self_attention_cache if isinstance(cache, EncoderDecoderCache) else cache
        return self._generating_stack().self_attention_mask(inputs_embeds, attention_mask, self_cache, position_ids)

    def _prefix_tuning_wrapper(self):
        """The PEFT model whose `generate` runs on this model with prefix tuning, or None.

        PEFT's `generate` (`PeftModelForCausalLM`, `PeftModelForSeq2SeqLM`) puts its own
        `prepare_inputs_for_generation` on the base model's instance for the duration of the call; that method
        calls this class's one first, then hands the prefix over as the cache at the first step.
        """
        override = self.__dict__.get("prepare_inputs_for_generation")
        wrapper = getattr(override, "__self__", None)
        if wrapper is None or wrapper is self or not type(wrapper).__module__.startswith("peft."):
            return None
        peft_type = getattr(getattr(wrapper, "active_peft_config", None), "peft_type", None)
        return wrapper if getattr(peft_type, "value", peft_type) in PREFIX_PEFT_TYPES else None

    def prepare_inputs_for_generation(self, input_ids: torch.LongTensor, *args, **kwargs) -> dict:
        """`GenerationMixin.prepare_inputs_for_generation`, after allocating a static cache.

        Under PEFT's prefix tuning (`_prefix_tuning_wrapper`), PEFT reads and writes the cache of the inputs
        prepared here to insert its prefix at the first step only, under its own name for it
        (`hfzoo.compat.peft_cache_name`: `past_key_values` before PEFT 0.22, the installed transformers' name
        from 0.22 on); the cache is therefore returned under PEFT's name (the model's `forward` takes both
        names), so that the prefix enters the generation cache once, as in PEFT's own forward pass.

        Args:
            input_ids: `(batch_size, seq_len)` the tokens so far (the decoder's, in the encoder-decoder).
            *args: passed on.
            **kwargs: passed on; `cache` is the generation cache.

        Returns:
            The keyword arguments of the next forward pass.

        Raises:
            ValueError: a static (compileable) cache under PEFT's prefix tuning: PEFT replaces the cache with
                its prefix, a dynamic cache (`cache_implementation="static"` would not be used).
                `use_cache=False` under PEFT's prefix tuning: PEFT then gives the model only the last token
                with its prefix, not the tokens so far.
        """
        cache = kwargs.get("cache", kwargs.get(LEGACY_CACHE_NAME))
        prefix_tuning = self._prefix_tuning_wrapper() is not None
        if prefix_tuning and isinstance(cache, Cache) and cache.is_compileable:
            raise ValueError(
                f"generate with PEFT prefix tuning needs a dynamic cache (PEFT puts its prefix into one), got "
                f"{type(cache).__name__}: leave cache_implementation unset"
            )
        if prefix_tuning and kwargs.get("use_cache") is False:
            raise ValueError(
                "generate with PEFT prefix tuning needs use_cache=True: PEFT keeps its prefix in the cache and "
                "feeds only the last token once the cache holds the prompt"
            )
        early_initialize_static_cache(self, kwargs.get("cache"), input_ids.shape[0])
        inputs = super().prepare_inputs_for_generation(input_ids, *args, **kwargs)
        name_for_peft = peft_cache_name() if prefix_tuning else CACHE_NAME
        if name_for_peft != CACHE_NAME and CACHE_NAME in inputs:
            inputs[name_for_peft] = inputs.pop(CACHE_NAME)
        return inputs

    # `generate` checks its keyword arguments against this method's parameters (then the model's `forward`'s):
    # report transformers' own, as before this override, so the check stays the same.
    prepare_inputs_for_generation.__signature__ = inspect.signature(GenerationMixin.prepare_inputs_for_generation)

    def _prepare_encoder_decoder_kwargs_for_generation(self, *args, **kwargs) -> dict:
        """The encoder's run before generation (`_prepare_text_encoder_decoder_kwargs_for_generation`), by its old name.

        PEFT before 0.21.2 reads this name when it wraps a model for `SEQ_2_SEQ_LM` (and restores it after
        `generate`); transformers calls only the new one.
        """
        return self._prepare_text_encoder_decoder_kwargs_for_generation(*args, **kwargs)


def _align_cpu_tensors(model: nn.Module, alignment: int = 64) -> None:
    """Move the CPU parameters and buffers that do not start on an `alignment`-byte boundary into fresh memory.

    Weights loaded from a safetensors file are views of the memory-mapped file, at offsets set by the file's
    header, so they are rarely aligned; some CPU matrix kernels then round differently than for the aligned
    memory of the model that was saved (seen on AMD EPYC hosts: mixture-of-experts logits 1.5e-8 apart), and
    unaligned loads are slower. A fresh copy makes a loaded model compute exactly what the saved one did.
    """
    with torch.no_grad():
        for tensor in [*model.parameters(), *model.buffers()]:
            if tensor.device.type == "cpu" and tensor.numel() and tensor.data_ptr() % alignment:
                tensor.data = tensor.data.clone()


def _as_device_tensor(value, device: torch.device) -> torch.Tensor:
    return value.to(device) if torch.is_tensor(value) else torch.tensor(value, device=device)


def normalize_summed_loss(summed: torch.Tensor, labels: torch.Tensor, num_items_in_batch=None) -> torch.Tensor:
    """A summed token loss as transformers' losses normalise it (`transformers.loss.loss_utils.fixed_cross_entropy`).

    Args:
        summed: float32 scalar, the loss summed over the labelled positions of this micro-batch.
        labels: the labels it was computed on, -100 = ignored.
        num_items_in_batch: the labelled positions of the whole accumulated batch (int or tensor), or None.

    Returns:
        float32 scalar: `summed / num_items_in_batch`, or without it the mean over `labels != -100` (NaN
        when every label is ignored, as `cross_entropy`'s mean).
    """
    if num_items_in_batch is None:
        return summed / labels.ne(-100).sum().to(summed.device)
    return summed / _as_device_tensor(num_items_in_batch, summed.device)


def sequence_classification_loss(
    labels: torch.Tensor, pooled_logits: torch.Tensor, config, num_items_in_batch=None
) -> torch.Tensor:
    """Sequence-classification loss of transformers (`ForSequenceClassificationLoss`), `num_items_in_batch` honoured.

    transformers' function normalises by `num_items_in_batch` only for single-label classification; its
    regression (MSE) and multi-label (BCE) losses stay per-batch means, which Trainer would then add up
    over the accumulated micro-batches. Here those are summed and divided by `num_items_in_batch` (Trainer
    counts every label element, so this is the mean over the whole accumulated batch).

    Args:
        labels: `(batch_size,)` class ids or regression targets, or `(batch_size, num_labels)` float targets.
        pooled_logits: `(batch_size, num_labels)`.
        config: the model config (`num_labels`, `problem_type`, set from the labels when None).
        num_items_in_batch: label elements of the whole accumulated batch, or None.

    Returns:
        A float32 scalar loss.
    """
    # transformers' function also settles `config.problem_type` from the labels when it is None.
    loss = ForSequenceClassificationLoss(
        labels=labels, pooled_logits=pooled_logits, config=config, num_items_in_batch=num_items_in_batch
    )
    if num_items_in_batch is None or config.problem_type == "single_label_classification":
        return loss
    labels = labels.to(pooled_logits.device)
    if config.problem_type == "regression" and config.num_labels == 1:
        summed = nn.functional.mse_loss(pooled_logits.squeeze().float(), labels.squeeze().float(), reduction="sum")
    elif config.problem_type == "regression":
        summed = nn.functional.mse_loss(pooled_logits.float(), labels.float(), reduction="sum")
    else:
        summed = nn.functional.binary_cross_entropy_with_logits(pooled_logits.float(), labels.float(), reduction="sum")
    return summed / _as_device_tensor(num_items_in_batch, summed.device)


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
class MoeQuestionAnsweringModelOutput(QuestionAnsweringModelOutput):
    """`QuestionAnsweringModelOutput` plus the mixture-of-experts fields (as `MoeMaskedLMOutput`).

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


@dataclass
class Seq2SeqMoEQuestionAnsweringModelOutput(Seq2SeqQuestionAnsweringModelOutput):
    """`Seq2SeqQuestionAnsweringModelOutput` plus the mixture-of-experts fields of `Seq2SeqMoELMOutput`.

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
