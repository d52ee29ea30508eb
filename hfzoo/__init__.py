"""hfzoo: a Hugging Face-compatible Transformer model zoo and pretraining pipeline.

Importing `hfzoo` registers every hfzoo config and model with transformers' Auto classes
(`AutoConfig`, `AutoModel`, `AutoModelForCausalLM`, `AutoModelForMaskedLM`, `AutoModelForSeq2SeqLM`,
`AutoModelForSequenceClassification`, `AutoModelForTokenClassification`, `AutoModelForQuestionAnswering`), so
that hfzoo checkpoints load with `from_pretrained` and work in pipelines.
"""

from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForCausalLM,
    AutoModelForMaskedLM,
    AutoModelForQuestionAnswering,
    AutoModelForSeq2SeqLM,
    AutoModelForSequenceClassification,
    AutoModelForTokenClassification,
)

from .configuration_utils import HfzooConfig
from .modeling_utils import HfzooPreTrainedModel
from .models.decoder import (
    HfzooDecoderConfig,
    HfzooDecoderForCausalLM,
    HfzooDecoderForQuestionAnswering,
    HfzooDecoderForSequenceClassification,
    HfzooDecoderForTokenClassification,
    HfzooDecoderModel,
    HfzooDecoderPreTrainedModel,
)
from .models.encoder import (
    HfzooEncoderConfig,
    HfzooEncoderForMaskedLM,
    HfzooEncoderForQuestionAnswering,
    HfzooEncoderForSequenceClassification,
    HfzooEncoderForTokenClassification,
    HfzooEncoderModel,
    HfzooEncoderPreTrainedModel,
)
from .models.encoder_decoder import (
    HfzooEncoderDecoderConfig,
    HfzooEncoderDecoderEncoderModel,
    HfzooEncoderDecoderForConditionalGeneration,
    HfzooEncoderDecoderForQuestionAnswering,
    HfzooEncoderDecoderForSequenceClassification,
    HfzooEncoderDecoderForTokenClassification,
    HfzooEncoderDecoderModel,
    HfzooEncoderDecoderPreTrainedModel,
)

__version__ = "0.1.0"

#: config class -> {Auto class: model class}; the single place that says which heads each family has.
AUTO_CLASSES = {
    HfzooDecoderConfig: {
        AutoModel: HfzooDecoderModel,
        AutoModelForCausalLM: HfzooDecoderForCausalLM,
        AutoModelForSequenceClassification: HfzooDecoderForSequenceClassification,
        AutoModelForTokenClassification: HfzooDecoderForTokenClassification,
        AutoModelForQuestionAnswering: HfzooDecoderForQuestionAnswering,
    },
    HfzooEncoderConfig: {
        AutoModel: HfzooEncoderModel,
        AutoModelForMaskedLM: HfzooEncoderForMaskedLM,
        AutoModelForSequenceClassification: HfzooEncoderForSequenceClassification,
        AutoModelForTokenClassification: HfzooEncoderForTokenClassification,
        AutoModelForQuestionAnswering: HfzooEncoderForQuestionAnswering,
    },
    HfzooEncoderDecoderConfig: {
        AutoModel: HfzooEncoderDecoderModel,
        AutoModelForSeq2SeqLM: HfzooEncoderDecoderForConditionalGeneration,
        AutoModelForSequenceClassification: HfzooEncoderDecoderForSequenceClassification,
        AutoModelForTokenClassification: HfzooEncoderDecoderForTokenClassification,
        AutoModelForQuestionAnswering: HfzooEncoderDecoderForQuestionAnswering,
    },
}

#: config class -> model classes outside the Auto classes, loaded by their own name (as transformers'
#: `T5EncoderModel`): the encoder-decoder's encoder alone.
OTHER_MODEL_CLASSES = {HfzooEncoderDecoderConfig: (HfzooEncoderDecoderEncoderModel,)}

for _config_class, _models in AUTO_CLASSES.items():
    AutoConfig.register(_config_class.model_type, _config_class, exist_ok=True)
    for _auto_class, _model_class in _models.items():
        _auto_class.register(_config_class, _model_class, exist_ok=True)

__all__ = [
    "AUTO_CLASSES",
    "OTHER_MODEL_CLASSES",
    "HfzooConfig",
    "HfzooDecoderConfig",
    "HfzooDecoderForCausalLM",
    "HfzooDecoderForQuestionAnswering",
    "HfzooDecoderForSequenceClassification",
    "HfzooDecoderForTokenClassification",
    "HfzooDecoderModel",
    "HfzooDecoderPreTrainedModel",
    "HfzooEncoderConfig",
    "HfzooEncoderDecoderConfig",
    "HfzooEncoderDecoderEncoderModel",
    "HfzooEncoderDecoderForConditionalGeneration",
    "HfzooEncoderDecoderForQuestionAnswering",
    "HfzooEncoderDecoderForSequenceClassification",
    "HfzooEncoderDecoderForTokenClassification",
    "HfzooEncoderDecoderModel",
    "HfzooEncoderDecoderPreTrainedModel",
    "HfzooEncoderForMaskedLM",
    "HfzooEncoderForQuestionAnswering",
    "HfzooEncoderForSequenceClassification",
    "HfzooEncoderForTokenClassification",
    "HfzooEncoderModel",
    "HfzooEncoderPreTrainedModel",
    "HfzooPreTrainedModel",
]
