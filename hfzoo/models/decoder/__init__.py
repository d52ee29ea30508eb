"""The hfzoo decoder family: causal language models and their task heads."""

from .configuration_decoder import HfzooDecoderConfig
from .modeling_decoder import (
    HfzooDecoderForCausalLM,
    HfzooDecoderForQuestionAnswering,
    HfzooDecoderForSequenceClassification,
    HfzooDecoderForTokenClassification,
    HfzooDecoderModel,
    HfzooDecoderPreTrainedModel,
)

__all__ = [
    "HfzooDecoderConfig",
    "HfzooDecoderForCausalLM",
    "HfzooDecoderForQuestionAnswering",
    "HfzooDecoderForSequenceClassification",
    "HfzooDecoderForTokenClassification",
    "HfzooDecoderModel",
    "HfzooDecoderPreTrainedModel",
]
