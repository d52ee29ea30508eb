"""The hfzoo encoder family: bidirectional masked language models and their task heads."""

from .configuration_encoder import HfzooEncoderConfig
from .modeling_encoder import (
    HfzooEncoderForMaskedLM,
    HfzooEncoderForQuestionAnswering,
    HfzooEncoderForSequenceClassification,
    HfzooEncoderForTokenClassification,
    HfzooEncoderModel,
    HfzooEncoderPreTrainedModel,
)

__all__ = [
    "HfzooEncoderConfig",
    "HfzooEncoderForMaskedLM",
    "HfzooEncoderForQuestionAnswering",
    "HfzooEncoderForSequenceClassification",
    "HfzooEncoderForTokenClassification",
    "HfzooEncoderModel",
    "HfzooEncoderPreTrainedModel",
]
