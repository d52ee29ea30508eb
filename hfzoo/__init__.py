"""hfzoo: a Hugging Face-compatible Transformer model zoo and pretraining pipeline.

Importing `hfzoo` registers every hfzoo config and model with transformers' Auto classes, so that
`AutoConfig`, `AutoModel` and `AutoModelForCausalLM` load hfzoo checkpoints.
"""

from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

from .configuration_utils import HfzooConfig
from .modeling_utils import HfzooPreTrainedModel
from .models.decoder import (
    HfzooDecoderConfig,
    HfzooDecoderForCausalLM,
    HfzooDecoderModel,
    HfzooDecoderPreTrainedModel,
)

__version__ = "0.1.0"

AutoConfig.register(HfzooDecoderConfig.model_type, HfzooDecoderConfig, exist_ok=True)
AutoModel.register(HfzooDecoderConfig, HfzooDecoderModel, exist_ok=True)
AutoModelForCausalLM.register(HfzooDecoderConfig, HfzooDecoderForCausalLM, exist_ok=True)

__all__ = [
    "HfzooConfig",
    "HfzooDecoderConfig",
    "HfzooDecoderForCausalLM",
    "HfzooDecoderModel",
    "HfzooDecoderPreTrainedModel",
    "HfzooPreTrainedModel",
]
