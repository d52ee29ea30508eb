#!/usr/bin/env python
"""What an encoder-decoder checkpoint's pretraining gives a GLUE classification task, with three finetuning heads.

    OMP_NUM_THREADS=2 python benchmarks/transfer_probe.py --task_name sst2 --data_dir ../shared/data/glue \
        --train_file outputs/study/glue_train_subsets/sst2.tsv \
        --models outputs/study/runs/vanilla-transformer/seed_0/pretrain outputs/study/runs/no-pretraining/seed_0/init

For each checkpoint (an hfzoo encoder-decoder saved with its tokenizer; a pretrained one and a randomly
initialised one side by side answer "does the pretraining help?"), the task's dev accuracy:

1. **Linear probes of frozen features**: a logistic regression (scikit-learn, standardised features, inverse
   regularisation `--probe_c`) fitted on the training file's features, of three kinds (float32
   `(num_examples, hidden_size)` each): the encoder's last hidden states averaged over the tokens (`encoder
   mean`); the decoder's last hidden state at the source's last end-of-sequence token, with the source shifted
   right as the decoder input (`decoder at eos`: what `HfzooEncoderDecoderForSequenceClassification` and the
   study classify); the input embeddings averaged over the tokens (`embeddings mean`, a bag of words).
2. **Text-to-text finetuning** (Raffel et al. 2020, §2.4; the protocol of Narang et al. 2021): the whole model
   trained with its language-modelling loss to write the label's name (`negative` / `positive` for SST-2, the
   hub's label names, each ending with the tokenizer's end-of-sequence token), AdamW at `--learning_rate`
   (constant, no weight decay), `--num_train_epochs` epochs of batches of `--per_device_train_batch_size`
   shuffled with `--seed`; then rank classification (Brown et al. 2020, §2.4): each dev example's prediction is
   the label whose tokens have the highest summed log-likelihood. `--num_train_epochs 0` skips it.

Prints a markdown table, one row per checkpoint. The study's own finetuning (a classification head on the
decoder at eos, the whole model trained) is `hfzoo-finetune-glue`; its accuracy is in each run's `glue/`
folder. Classification tasks only (not STS-B); sentence pairs are given to the tokenizer as a pair, as
`hfzoo-finetune-glue` does. Runs on the CPU or, when CUDA is available, the GPU, in float32.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from transformers import AutoConfig, AutoModelForSeq2SeqLM, AutoTokenizer

import hfzoo  # noqa: F401  (registers the hfzoo model classes with the Auto classes)
from hfzoo.data.glue import get_glue_task, load_glue
from hfzoo.models.encoder_decoder.modeling_encoder_decoder import shift_tokens_right
from hfzoo.modules.heads import last_eos_pool

FEATURES = ("encoder mean", "decoder at eos", "embeddings mean")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line; refuses an unknown or regression task and a folder that is no encoder-decoder checkpoint."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", required=True, help="encoder-decoder checkpoint folders")
    parser.add_argument("--task_name", default="sst2", help="a GLUE classification task (default: sst2)")
    parser.add_argument("--data_dir", default="../shared/data/glue", help="GLUE folder (default: %(default)s)")
    parser.add_argument("--train_file", default=None, help="training file (default: the task's train.tsv)")
    parser.add_argument("--max_train_samples", type=int, default=None, help="the first N training examples")
    parser.add_argument("--max_eval_samples", type=int, default=None, help="the first N dev examples")
    parser.add_argument("--max_length", type=int, default=128, help="tokens per input (default: 128)")
    parser.add_argument("--probe_c", type=float, default=0.1, help="logistic regression's C (default: 0.1)")
    parser.add_argument("--learning_rate", type=float, default=3e-4, help="text-to-text (default: 3e-4)")
    parser.add_argument("--per_device_train_batch_size", type=int, default=32, help="default: 32")
    parser.add_argument("--num_train_epochs", type=int, default=3, help="text-to-text epochs; 0 skips it")
    parser.add_argument("--seed", type=int, default=0, help="text-to-text shuffling and dropout (default: 0)")
    args = parser.parse_args(argv)
    try:
        task = get_glue_task(args.task_name)
    except ValueError as err:
        parser.error(f"--task_name: {err}")
    if task.is_regression:
        parser.error(f"--task_name {args.task_name}: a classification task is needed (STS-B is a regression)")
    for model in args.models:
        if not Path(model).is_dir():
            parser.error(f"--models {model}: no such checkpoint folder")
        try:
            model_type = AutoConfig.from_pretrained(model).model_type
        except (OSError, ValueError) as err:
            parser.error(f"--models {model}: not a checkpoint folder ({err})")
        if model_type != "hfzoo_encoder_decoder":
            parser.error(f"--models {model}: an hfzoo encoder-decoder checkpoint is needed, not {model_type!r}")
    if args.num_train_epochs < 0 or args.per_device_train_batch_size < 1 or args.probe_c <= 0:
        parser.error("--num_train_epochs >= 0, --per_device_train_batch_size >= 1 and --probe_c > 0 are needed")
    return args


def read_task(args: argparse.Namespace):
    """`(task, {split: (texts as a list of tuples of str, labels int64 array)})` for train and the first dev split."""
    task = get_glue_task(args.task_name)
    raw = load_glue(task, args.data_dir, args.train_file)
    dev = next(split for split in raw if split.startswith("validation"))
    splits = {}
    for split, limit in (("train", args.max_train_samples), (dev, args.max_eval_samples)):
        data = raw[split].select(range(min(limit or len(raw[split]), len(raw[split]))))
        texts = list(zip(*(data[name] for name in task.text_names)))
        splits["train" if split == "train" else "dev"] = (texts, np.asarray(data["label"], dtype=np.int64))
    return task, splits


def encode(tokenizer, texts: list[tuple[str, ...]], max_length: int, device) -> dict[str, torch.Tensor]:
    """Tokenize a batch of one- or two-text examples: `input_ids`, `attention_mask` `(batch, seq_len)`."""
    columns = [list(column) for column in zip(*texts)]
    batch = tokenizer(*columns, padding=True, truncation=True, max_length=max_length, return_tensors="pt")
    return {key: batch[key].to(device) for key in ("input_ids", "attention_mask")}


@torch.no_grad()
def features(model, tokenizer, texts, max_length: int, batch_size: int = 64) -> dict[str, np.ndarray]:
    """The three frozen feature kinds of `FEATURES`, float32 `(len(texts), hidden_size)` each."""
    model.eval()
    config = model.config
    out = {name: [] for name in FEATURES}
    for start in range(0, len(texts), batch_size):
        batch = encode(tokenizer, texts[start : start + batch_size], max_length, model.device)
        ids, mask = batch["input_ids"], batch["attention_mask"]
        decoder_ids = shift_tokens_right(ids, config.pad_token_id, config.decoder_start_token_id)
        result = model.model(input_ids=ids, attention_mask=mask, decoder_input_ids=decoder_ids,
                             decoder_attention_mask=mask)  # fmt: skip
        weights = mask.unsqueeze(-1).float()
        out["encoder mean"].append((result.encoder_last_hidden_state * weights).sum(1) / weights.sum(1))
        out["decoder at eos"].append(last_eos_pool(result.last_hidden_state, ids, config.eos_token_id))
        out["embeddings mean"].append((model.get_input_embeddings()(ids) * weights).sum(1) / weights.sum(1))
    return {name: torch.cat(parts).float().cpu().numpy() for name, parts in out.items()}


def probe_accuracy(train: np.ndarray, train_labels, dev: np.ndarray, dev_labels, c: float) -> float:
    """Dev accuracy (%) of a logistic regression on standardised features."""
    probe = make_pipeline(StandardScaler(), LogisticRegression(C=c, max_iter=5000))
    probe.fit(train, train_labels)
    return 100.0 * float((probe.predict(dev) == dev_labels).mean())


def label_targets(tokenizer, names: tuple[str, ...], device) -> torch.Tensor:
    """Each label name's token ids, end-of-sequence included, as `(num_labels, length)` with -100 padding."""
    ids = [tokenizer(name)["input_ids"] for name in names]
    if ids[0][-1] != tokenizer.eos_token_id:
        ids = [row + [tokenizer.eos_token_id] for row in ids]
    targets = torch.full((len(ids), max(map(len, ids))), -100, dtype=torch.long)
    for row, tokens in enumerate(ids):
        targets[row, : len(tokens)] = torch.tensor(tokens)
    return targets.to(device)


def sequence_log_likelihood(model, batch: dict[str, torch.Tensor], labels: torch.Tensor) -> torch.Tensor:
    """Summed log-probability `(batch,)` float32 of each row's `labels` `(batch, length)` (-100 ignored)."""
    logits = model(**batch, labels=labels).logits.float().log_softmax(-1)
    picked = logits.gather(-1, labels.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    return picked.masked_fill(labels.eq(-100), 0.0).sum(-1)


def text_to_text_accuracy(model, tokenizer, task, splits, args: argparse.Namespace) -> float:
    """Finetune the whole model to write the label names (module docstring), then rank-classify dev (%)."""
    targets = label_targets(tokenizer, task.label_names, model.device)
    texts, labels = splits["train"]
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.learning_rate, weight_decay=0.0)
    generator = torch.Generator().manual_seed(args.seed)
    model.train()
    for _ in range(args.num_train_epochs):
        order = torch.randperm(len(texts), generator=generator).tolist()
        for start in range(0, len(order), args.per_device_train_batch_size):
            rows = order[start : start + args.per_device_train_batch_size]
            batch = encode(tokenizer, [texts[i] for i in rows], args.max_length, model.device)
            model(**batch, labels=targets[torch.as_tensor(labels[rows], device=model.device)]).loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    model.eval()
    texts, labels = splits["dev"]
    correct = 0
    with torch.no_grad():
        for start in range(0, len(texts), 64):
            batch = encode(tokenizer, texts[start : start + 64], args.max_length, model.device)
            rows = batch["input_ids"].shape[0]
            scores = torch.stack(
                [sequence_log_likelihood(model, batch, targets[k].expand(rows, -1)) for k in range(len(targets))],
                dim=-1,
            )
            correct += int((scores.argmax(-1).cpu().numpy() == labels[start : start + 64]).sum())
    return 100.0 * correct / len(texts)


def main(argv: list[str] | None = None) -> list[dict]:
    """Run the probes and the text-to-text finetuning of each checkpoint; print and return the rows."""
    args = parse_args(argv)
    task, splits = read_task(args)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    majority = 100.0 * float(np.mean(splits["dev"][1] == np.bincount(splits["train"][1]).argmax()))
    rows = []
    for path in args.models:
        torch.manual_seed(args.seed)
        tokenizer = AutoTokenizer.from_pretrained(path)
        model = AutoModelForSeq2SeqLM.from_pretrained(path, attn_implementation="eager", dtype=torch.float32)
        model.to(device)
        train, dev = (features(model, tokenizer, splits[s][0], args.max_length) for s in ("train", "dev"))
        row = {"model": path}
        for name in FEATURES:
            row[name] = probe_accuracy(train[name], splits["train"][1], dev[name], splits["dev"][1], args.probe_c)
        row["text-to-text"] = (
            text_to_text_accuracy(model, tokenizer, task, splits, args) if args.num_train_epochs else float("nan")
        )
        rows.append(row)
    columns = (*FEATURES, "text-to-text")
    print(f"{task.name} dev accuracy (%), {len(splits['train'][0])} training examples; majority class {majority:.1f}")
    print("| model | " + " | ".join(f"probe: {c}" if c in FEATURES else c for c in columns) + " |")
    print("|---|" + "---:|" * len(columns))
    for row in rows:
        print(f"| {row['model']} | " + " | ".join(f"{row[c]:.1f}" for c in columns) + " |")
    return rows


if __name__ == "__main__":
    main()
