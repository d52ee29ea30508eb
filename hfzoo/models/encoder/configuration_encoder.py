"""Configuration of the hfzoo encoder family (bidirectional masked language models)."""

from __future__ import annotations

from huggingface_hub.dataclasses import strict

from ...configuration_utils import HfzooConfig
from ...modules.stack import StackLayout


@strict
class HfzooEncoderConfig(HfzooConfig):
    r"""Configuration of the hfzoo encoder models (`model_type="hfzoo_encoder"`).

    Fields of `hfzoo.configuration_utils.HfzooConfig`, plus:

    Args:
        type_vocab_size: number of token-type (segment) ids, BERT's sentence A/B embeddings
            (Devlin et al. 2019, §3); 0 disables them.
        classifier_dropout: dropout before the classification heads (None: `hidden_dropout_prob`).

    Example:
        ```python
        >>> import hfzoo
        >>> from transformers import AutoModelForMaskedLM
        >>> config = hfzoo.HfzooEncoderConfig(vocab_size=8192, hidden_size=256, num_hidden_layers=4,
        ...                                   num_attention_heads=4, intermediate_size=1024)
        >>> model = AutoModelForMaskedLM.from_config(config)
        ```
    """

    model_type = "hfzoo_encoder"

    type_vocab_size: int = 2
    classifier_dropout: float | int | None = None

    def stack_layouts(self) -> tuple[StackLayout, ...]:
        """One bidirectional stack of `num_hidden_layers` layers (see `HfzooConfig.stack_layouts`)."""
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
            ),
        )

    def validate_hfzoo_encoder(self) -> None:
        """Check the encoder-only fields; raise `ValueError` naming the bad one."""
        if not isinstance(self.type_vocab_size, int) or self.type_vocab_size < 0:
            raise ValueError(f"type_vocab_size must be an integer >= 0, got {self.type_vocab_size!r}")
