"""Convert between transformers' reference models and hfzoo, both ways: GPT-2, BERT, T5, Llama, Qwen3, Mistral.

One module per source model, each with its config mapping, its state-dict tables and both directions:

- `hfzoo.convert.gpt2`: GPT-2 (`GPT2LMHeadModel`, `GPT2ForSequenceClassification`, `GPT2ForTokenClassification`,
  `GPT2ForQuestionAnswering`) <-> the hfzoo decoder (`HfzooDecoderForCausalLM`) and its heads;
- `hfzoo.convert.bert`: BERT (`BertModel`, `BertForMaskedLM`, `BertForSequenceClassification`,
  `BertForQuestionAnswering`, `BertForTokenClassification`) <-> the hfzoo encoder, and `convert_bert_checkpoint`
  (a folder, pooler kept for sequence classification);
- `hfzoo.convert.t5`: T5 (`T5ForConditionalGeneration`, v1.0 and v1.1, `T5ForSequenceClassification`,
  `T5ForQuestionAnswering`) <-> the hfzoo encoder-decoder and its heads;
- `hfzoo.convert.llama`: Llama, Qwen3 and Mistral (`LlamaForCausalLM`, `Qwen3ForCausalLM`, `MistralForCausalLM`,
  and their `...ForSequenceClassification`, `...ForTokenClassification`, `...ForQuestionAnswering`) <-> the hfzoo
  decoder and its heads;
- `hfzoo.convert.gguf`: a Llama-shaped decoder (hfzoo or native Llama / Qwen3) as a GGUF file for llama.cpp
  (`write_gguf`, `convert_to_gguf`; needs the `gguf` extra);
- `hfzoo.convert.common`: the checks and the loading they share, and the hfzoo decoder's heads
  (`HFZOO_DECODER_HEADS`) the decoder converters map position by position;
- `hfzoo.convert.cli`: `convert_checkpoint(src, dst)` for folders, either direction, and the `hfzoo-convert` CLI.

Every public name is importable from `hfzoo.convert`. Conversions only rename, split, concatenate and
transpose tensors, so round trips return the original state dict exactly (example in `hfzoo.convert.gpt2`).
"""

from .bert import (
    BERT_TO_HFZOO_GLOBAL,
    BERT_TO_HFZOO_HEADS,
    BERT_TO_HFZOO_LAYER,
    BERT_TO_HFZOO_TOKEN_CLASSIFIER,
    bert_config_from_hfzoo,
    bert_state_dict_to_hfzoo,
    bert_to_hfzoo,
    convert_bert_checkpoint,
    hfzoo_config_from_bert,
    hfzoo_to_bert,
)
from .cli import convert_checkpoint
from .common import HFZOO_DECODER_HEADS
from .gguf import (
    GGUF_OUTTYPES,
    check_gguf_config,
    convert_to_gguf,
    gguf_permute_qk,
    gguf_unpermute_qk,
    write_gguf,
)
from .gpt2 import (
    GPT2_HEADS,
    GPT2_TO_HFZOO_GLOBAL,
    GPT2_TO_HFZOO_HEADS,
    GPT2_TO_HFZOO_LAYER,
    gpt2_config_from_hfzoo,
    gpt2_to_hfzoo,
    hfzoo_config_from_gpt2,
    hfzoo_to_gpt2,
)
from .llama import (
    LLAMA_TO_HFZOO_GLOBAL,
    LLAMA_TO_HFZOO_LAYER,
    NATIVE_LLAMA_CLASSES,
    NATIVE_LLAMA_HEADS,
    hfzoo_config_from_llama,
    hfzoo_to_llama,
    llama_config_from_hfzoo,
    llama_to_hfzoo,
)
from .t5 import (
    HFZOO_T5_HEADS,
    T5_HEADS,
    T5_TO_HFZOO_CLASSIFIER,
    T5_TO_HFZOO_DECODER_LAYER,
    T5_TO_HFZOO_ENCODER_LAYER,
    T5_TO_HFZOO_GLOBAL,
    T5_TO_HFZOO_MLP,
    hfzoo_config_from_t5,
    hfzoo_to_t5,
    t5_config_from_hfzoo,
    t5_to_hfzoo,
)

__all__ = [
    "BERT_TO_HFZOO_GLOBAL",
    "BERT_TO_HFZOO_HEADS",
    "BERT_TO_HFZOO_LAYER",
    "BERT_TO_HFZOO_TOKEN_CLASSIFIER",
    "GGUF_OUTTYPES",
    "GPT2_HEADS",
    "GPT2_TO_HFZOO_GLOBAL",
    "GPT2_TO_HFZOO_HEADS",
    "GPT2_TO_HFZOO_LAYER",
    "HFZOO_DECODER_HEADS",
    "LLAMA_TO_HFZOO_GLOBAL",
    "LLAMA_TO_HFZOO_LAYER",
    "NATIVE_LLAMA_CLASSES",
    "NATIVE_LLAMA_HEADS",
    "HFZOO_T5_HEADS",
    "T5_HEADS",
    "T5_TO_HFZOO_CLASSIFIER",
    "T5_TO_HFZOO_DECODER_LAYER",
    "T5_TO_HFZOO_ENCODER_LAYER",
    "T5_TO_HFZOO_GLOBAL",
    "T5_TO_HFZOO_MLP",
    "bert_config_from_hfzoo",
    "bert_state_dict_to_hfzoo",
    "bert_to_hfzoo",
    "check_gguf_config",
    "convert_bert_checkpoint",
    "convert_checkpoint",
    "convert_to_gguf",
    "gguf_permute_qk",
    "gguf_unpermute_qk",
    "gpt2_config_from_hfzoo",
    "gpt2_to_hfzoo",
    "hfzoo_config_from_bert",
    "hfzoo_config_from_gpt2",
    "hfzoo_config_from_llama",
    "hfzoo_config_from_t5",
    "hfzoo_to_bert",
    "hfzoo_to_gpt2",
    "hfzoo_to_llama",
    "hfzoo_to_t5",
    "llama_config_from_hfzoo",
    "llama_to_hfzoo",
    "t5_config_from_hfzoo",
    "t5_to_hfzoo",
    "write_gguf",
]
