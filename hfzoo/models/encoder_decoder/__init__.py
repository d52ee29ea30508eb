"""The hfzoo encoder-decoder family: sequence-to-sequence models (T5-style span corruption) and heads."""

from .configuration_encoder_decoder import HfzooEncoderDecoderConfig
from .modeling_encoder_decoder import (
    HfzooEncoderDecoderEncoderModel,
    HfzooEncoderDecoderForConditionalGeneration,
    HfzooEncoderDecoderForQuestionAnswering,
    HfzooEncoderDecoderForSequenceClassification,
    HfzooEncoderDecoderForTokenClassification,
    HfzooEncoderDecoderModel,
    HfzooEncoderDecoderPreTrainedModel,
    HfzooEncoderDecoderStack,
    shift_tokens_right,
)

__all__ = [
    "HfzooEncoderDecoderConfig",
    "HfzooEncoderDecoderEncoderModel",
    "HfzooEncoderDecoderForConditionalGeneration",
    "HfzooEncoderDecoderForQuestionAnswering",
    "HfzooEncoderDecoderForSequenceClassification",
    "HfzooEncoderDecoderForTokenClassification",
    "HfzooEncoderDecoderModel",
    "HfzooEncoderDecoderPreTrainedModel",
    "HfzooEncoderDecoderStack",
    "shift_tokens_right",
]
