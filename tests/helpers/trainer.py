"""Tiny models of every head, their datasets, and a transformers `Trainer` run over them."""

from __future__ import annotations

import torch
from transformers import Trainer, TrainingArguments

from helpers.variant_checks import TINY
from hfzoo import (
    HfzooDecoderConfig,
    HfzooDecoderForCausalLM,
    HfzooDecoderForQuestionAnswering,
    HfzooDecoderForSequenceClassification,
    HfzooDecoderForTokenClassification,
    HfzooEncoderConfig,
    HfzooEncoderDecoderConfig,
    HfzooEncoderDecoderForConditionalGeneration,
    HfzooEncoderDecoderForQuestionAnswering,
    HfzooEncoderDecoderForSequenceClassification,
    HfzooEncoderDecoderForTokenClassification,
    HfzooEncoderForMaskedLM,
    HfzooEncoderForQuestionAnswering,
    HfzooEncoderForSequenceClassification,
    HfzooEncoderForTokenClassification,
)

NUM_EXAMPLES, SEQ_LEN, TGT_LEN = 24, 10, 6

HEADS = {
    "decoder-clm": (HfzooDecoderForCausalLM, HfzooDecoderConfig, {}),
    "decoder-seqcls": (HfzooDecoderForSequenceClassification, HfzooDecoderConfig, {"num_labels": 3}),
    "decoder-tokcls": (HfzooDecoderForTokenClassification, HfzooDecoderConfig, {"num_labels": 5}),
    "decoder-qa": (HfzooDecoderForQuestionAnswering, HfzooDecoderConfig, {}),
    "encoder-mlm": (HfzooEncoderForMaskedLM, HfzooEncoderConfig, {}),
    "encoder-seqcls": (HfzooEncoderForSequenceClassification, HfzooEncoderConfig, {"num_labels": 3}),
    "encoder-regression": (HfzooEncoderForSequenceClassification, HfzooEncoderConfig, {"num_labels": 1}),
    "encoder-tokcls": (HfzooEncoderForTokenClassification, HfzooEncoderConfig, {"num_labels": 5}),
    "encoder-qa": (HfzooEncoderForQuestionAnswering, HfzooEncoderConfig, {}),
    "encoder-decoder-seq2seq": (HfzooEncoderDecoderForConditionalGeneration, HfzooEncoderDecoderConfig, {}),
    "encoder-decoder-seqcls": (
        HfzooEncoderDecoderForSequenceClassification,
        HfzooEncoderDecoderConfig,
        {"num_labels": 3},
    ),
    "encoder-decoder-qa": (HfzooEncoderDecoderForQuestionAnswering, HfzooEncoderDecoderConfig, {}),
    "encoder-decoder-tokcls": (
        HfzooEncoderDecoderForTokenClassification,
        HfzooEncoderDecoderConfig,
        {"num_labels": 5},
    ),
}


def build(head: str, seed: int = 0, **overrides):
    model_class, config_class, head_overrides = HEADS[head]
    torch.manual_seed(seed)
    return model_class(config_class(**{**TINY, **head_overrides, **overrides}))


def dataset(head: str, seed: int = 0) -> list[dict[str, torch.Tensor]]:
    """Examples of one length whose numbers of labelled positions differ (padding, masking, -100 tails)."""
    g = torch.Generator().manual_seed(seed)
    examples = []
    for i in range(NUM_EXAMPLES):
        length = 3 + (i * 7) % (SEQ_LEN - 2)  # 3..SEQ_LEN, in no sorted order
        ids = torch.full((SEQ_LEN,), TINY["pad_token_id"])
        ids[:length] = torch.randint(2, TINY["vocab_size"], (length,), generator=g)
        mask = (torch.arange(SEQ_LEN) < length).long()
        example = {"input_ids": ids, "attention_mask": mask}
        if head == "decoder-clm":
            example["labels"] = ids.masked_fill(mask == 0, -100)
        elif head == "encoder-mlm":
            chosen = (torch.rand(SEQ_LEN, generator=g) < 0.4) & (mask == 1)
            chosen[0] = True
            example["labels"] = ids.masked_fill(~chosen, -100)
        elif head.endswith("-tokcls"):
            example["labels"] = torch.randint(0, 5, (SEQ_LEN,), generator=g).masked_fill(mask == 0, -100)
        elif head.endswith("-qa"):  # an answer span inside the row's tokens
            start = int(torch.randint(0, length, (), generator=g))
            example["start_positions"] = torch.tensor(start)
            example["end_positions"] = torch.randint(start, length, (), generator=g)
        elif head == "encoder-decoder-seq2seq":
            target = torch.randint(2, TINY["vocab_size"], (TGT_LEN,), generator=g)
            example["labels"] = target.masked_fill(torch.arange(TGT_LEN) >= 1 + i % TGT_LEN, -100)
        elif head == "encoder-regression":
            example["labels"] = torch.rand((), generator=g)
        else:
            if head == "encoder-decoder-seqcls":
                ids[length - 1] = TINY["eos_token_id"]  # pooled at the last EOS
            example["labels"] = torch.randint(0, 3, (), generator=g)
        examples.append(example)
    return examples


def train(model, tmp_path, examples, eval_examples=None, **arguments):
    defaults = dict(
        output_dir=str(tmp_path),
        max_steps=3,
        learning_rate=1e-3,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        seed=0,
        train_sampling_strategy="sequential",
        remove_unused_columns=False,
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    args = TrainingArguments(**{**defaults, **arguments})
    trainer = Trainer(model=model, args=args, train_dataset=examples, eval_dataset=eval_examples)
    trainer.train()
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    return trainer, losses
