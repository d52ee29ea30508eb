"""Configuration of the hfzoo decoder family (causal language models)."""

from __future__ import annotations

from huggingface_hub.dataclasses import strict

from ...configuration_utils import HfzooConfig
from ...modules.stack import StackLayout


@strict
class HfzooDecoderConfig(HfzooConfig):
    r"""Configuration of `HfzooDecoderModel` / `HfzooDecoderForCausalLM` (`model_type="hfzoo_decoder"`).

    Fields of `hfzoo.configuration_utils.HfzooConfig`, plus:

    Args:
        classifier_dropout: dropout before the token-classification head (None: `hidden_dropout_prob`).

    The defaults describe the decoder of Vaswani et al. 2017 as GPT-2 runs it: pre-LN, learned absolute
    positions, GELU feed-forward, tied input/output embeddings.

    Example:
        ```python
        >>> import hfzoo
        >>> from transformers import AutoModelForCausalLM
        >>> config = hfzoo.HfzooDecoderConfig(vocab_size=8192, hidden_size=256, num_hidden_layers=4,
        ...                                   num_attention_heads=4, intermediate_size=1024)
        >>> model = AutoModelForCausalLM.from_config(config)
        ```
    """

    model_type = "hfzoo_decoder"

    classifier_dropout: float | int | None = None

    def stack_layouts(self) -> tuple[StackLayout, ...]:
        """One causal stack of `num_hidden_layers` layers (see `HfzooConfig.stack_layouts`)."""
        return (
            StackLayout(
                "decoder",
                self.num_hidden_layers,
                "num_hidden_layers",
                True,
                False,
                self.token_mixer,
                layer_stack=self.layer_stack,
                memory_layers=self.memory_layers,
            ),
        )
