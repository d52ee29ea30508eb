"""The hfzoo decoder family: causal language models and their task heads."""

from .configuration_decoder import HfzooDecoderConfig
from .modeling_decoder import (
    HfzooDecoderForCausalLM,
    HfzooDecoderForSequenceClassification,
    HfzooDecoderModel,
    HfzooDecoderPreTrainedModel,
)

__all__ = [
    "HfzooDecoderConfig",
    "HfzooDecoderForCausalLM",
    "HfzooDecoderForSequenceClassification",
    "HfzooDecoderModel",
    "HfzooDecoderPreTrainedModel",
]
