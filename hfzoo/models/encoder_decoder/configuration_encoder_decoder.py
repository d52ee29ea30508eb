"""Configuration of the hfzoo encoder-decoder family (sequence-to-sequence models)."""

from __future__ import annotations

from huggingface_hub.dataclasses import strict

from ...compat import CACHE_NAME
from ...configuration_utils import HfzooConfig
from ...modules.stack import StackLayout


@strict
class HfzooEncoderDecoderConfig(HfzooConfig):
    r"""Configuration of the hfzoo encoder-decoder models (`model_type="hfzoo_encoder_decoder"`).

    Fields of `hfzoo.configuration_utils.HfzooConfig` (`num_hidden_layers` is the encoder's depth), plus:

    Args:
        num_decoder_layers: decoder depth (None: same as `num_hidden_layers`).
        decoder_start_token_id: first decoder input; labels are shifted right behind it as in T5
            (Raffel et al. 2020), which uses the padding id 0.
        classifier_dropout: dropout in the sequence-classification head (None: `hidden_dropout_prob`).
        tie_encoder_decoder_embeddings: one token embedding matrix for the encoder and decoder inputs
            (Vaswani et al. 2017 §3.4, T5); False gives the decoder its own.
        decoder_token_mixer: the decoder's token mixer (a key of `hfzoo.modules.mixers.TOKEN_MIXERS`), when
            it differs from the encoder's `token_mixer` (e.g. a bidirectional-only mixer in the encoder and
            self-attention in the decoder); None: `token_mixer` in both stacks.
        decoder_layer_stack: the decoder's layer stack (a key of `hfzoo.modules.stack.LAYER_STACKS`), when it
            differs from the encoder's `layer_stack` (the Funnel Transformer's encoder with a `standard`
            decoder, as Narang et al. 2021); None: `layer_stack` in both stacks.
        decoder_memory_layers: the decoder's product-key-memory feed-forward indices (see `memory_layers`),
            when they differ from the encoder's (Narang et al. 2021: the decoder's 11th of 12 layers, `[-2]`);
            None: `memory_layers` in both stacks.

    The three vocabulary matrices (encoder input, decoder input, decoder output) of Narang et al. 2021:
    `(tie_encoder_decoder_embeddings, tie_word_embeddings)` = `(True, True)` is their baseline (all three
    shared), `(True, False)` "Tied encoder/decoder input embeddings", `(False, True)` "Tied decoder input
    and output embeddings", `(False, False)` "Untied embeddings". `block_sharing` may also be `encoder` or `decoder`.
    """

    model_type = "hfzoo_encoder_decoder"
    keys_to_ignore_at_inference = [CACHE_NAME]  # the cache is no prediction
    attribute_map = {"num_encoder_layers": "num_hidden_layers"}

    num_decoder_layers: int | None = None
    decoder_start_token_id: int | None = 0
    classifier_dropout: float | int | None = None
    is_encoder_decoder: bool = True
    tie_encoder_decoder_embeddings: bool = True
    decoder_token_mixer: str | None = None
    decoder_layer_stack: str | None = None
    decoder_memory_layers: list[int] | None = None

    def __post_init__(self, **kwargs):
        if self.num_decoder_layers is None:
            self.num_decoder_layers = self.num_hidden_layers
        super().__post_init__(**kwargs)

    def stack_layouts(self) -> tuple[StackLayout, ...]:
        """The bidirectional encoder and the causal, cross-attending decoder (see `HfzooConfig.stack_layouts`)."""
        decoder_memory = self.memory_layers if self.decoder_memory_layers is None else self.decoder_memory_layers
        return (
            StackLayout(
                "encoder",
                self.num_hidden_layers,
                "num_hidden_layers",
                False,
                False,
                self.token_mixer,
                layer_stack=self.layer_stack,
                memory_layers=self.memory_layers,
                per_token_outputs=False,  # read by the decoder's cross-attention only
            ),
            StackLayout(
                "decoder",
                self.num_decoder_layers,
                "num_decoder_layers",
                True,
                True,
                self.decoder_token_mixer or self.token_mixer,
                "decoder_token_mixer" if self.decoder_token_mixer else "token_mixer",
                layer_stack=self.decoder_layer_stack or self.layer_stack,
                layer_stack_field="decoder_layer_stack" if self.decoder_layer_stack else "layer_stack",
                memory_layers=decoder_memory,
                memory_layers_field="decoder_memory_layers"
                if self.decoder_memory_layers is not None
                else "memory_layers",
            ),
        )

    def validate_hfzoo_encoder_decoder(self) -> None:
        """Check the encoder-decoder fields; raise `ValueError` naming the bad one."""
        if not isinstance(self.num_decoder_layers, int) or self.num_decoder_layers < 1:
            raise ValueError(f"num_decoder_layers must be a positive integer, got {self.num_decoder_layers!r}")
        if not self.is_encoder_decoder:
            raise ValueError("is_encoder_decoder must be True for hfzoo_encoder_decoder")
        start = self.decoder_start_token_id
        if start is not None and not 0 <= start < self.vocab_size:
            raise ValueError(f"decoder_start_token_id={start} is outside the vocabulary [0, {self.vocab_size})")
