"""The hfzoo decoder family: causal language models."""

from .configuration_decoder import HfzooDecoderConfig
from .modeling_decoder import HfzooDecoderForCausalLM, HfzooDecoderModel, HfzooDecoderPreTrainedModel

__all__ = [
    "HfzooDecoderConfig",
    "HfzooDecoderForCausalLM",
    "HfzooDecoderModel",
    "HfzooDecoderPreTrainedModel",
]
