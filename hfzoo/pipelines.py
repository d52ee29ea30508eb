"""A text-to-text generation pipeline for encoder-decoder checkpoints.

transformers v5 removed its `text2text-generation` pipeline (and refuses that task name); this module
provides the same behaviour for seq2seq models, registered as the task `hfzoo-text2text-generation`:

```python
import hfzoo.pipelines  # registers the task
from transformers import pipeline

t2t = pipeline("hfzoo-text2text-generation", model="outputs/t5-small")
t2t("translate this", max_new_tokens=16)  # [{"generated_text": "..."}]
```
"""

from __future__ import annotations

from typing import Any

from transformers import AutoModelForSeq2SeqLM, Pipeline
from transformers.pipelines import PIPELINE_REGISTRY

TASK = "hfzoo-text2text-generation"


class Text2TextGenerationPipeline(Pipeline):
    """Encode the input text, `generate()` the output with an encoder-decoder, decode it.

    Generation keyword arguments (`max_new_tokens`, `do_sample`, `num_beams`, ...) are passed to
    `model.generate`. Returns one `{"generated_text": str}` per input text.
    """

    _load_tokenizer = True
    _load_processor = False
    _load_image_processor = False
    _load_feature_extractor = False

    def _sanitize_parameters(self, **kwargs: Any):
        return {}, kwargs, {}

    def preprocess(self, inputs: str) -> dict:
        """Tokenize one text into `input_ids` / `attention_mask` `(1, src_len)`."""
        return self.tokenizer(inputs, return_tensors="pt")

    def _forward(self, model_inputs: dict, **generate_kwargs: Any) -> dict:
        return {"output_ids": self.model.generate(**model_inputs, **generate_kwargs)}

    def postprocess(self, model_outputs: dict) -> list[dict[str, str]]:
        """Decode the generated ids `(num_sequences, tgt_len)` without special tokens."""
        texts = self.tokenizer.batch_decode(model_outputs["output_ids"], skip_special_tokens=True)
        return [{"generated_text": text} for text in texts]


PIPELINE_REGISTRY.register_pipeline(TASK, pipeline_class=Text2TextGenerationPipeline, pt_model=AutoModelForSeq2SeqLM)
