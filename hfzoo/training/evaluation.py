"""Language-model evaluation: validation loss, perplexity, and the unigram baseline."""

from __future__ import annotations

import math

import numpy as np
import torch


@torch.no_grad()
def evaluate_lm(model, dataloader, accelerator=None, seed: int | None = None) -> dict[str, float]:
    """Mean loss and perplexity of `model` over `dataloader` (all processes gathered), for any objective.

    The loss of each batch is the model's mean over predicted tokens (next tokens, masked tokens or
    span targets); the mean of batch losses weighted by batch size is reported (exactly the per-token
    mean for packed causal-LM blocks, which all predict the same number of tokens).

    Args:
        model: a model returning `.loss` for the batches (causal LM, masked LM, seq2seq LM).
        dataloader: batches of model inputs with `labels` (collated on the fly for mlm / span).
        accelerator: an `accelerate.Accelerator` to gather losses across processes, or None.
        seed: when given, the random masking/corruption of the collator is drawn from torch's RNG
            seeded with it, so every evaluation sees the same masks; the caller's RNG state is restored.

    Returns:
        `{"eval_loss": nats per token, "perplexity": exp(eval_loss)}` (perplexity is `inf` on overflow).
    """
    was_training = model.training
    model.eval()
    losses = []
    with torch.random.fork_rng(devices=[]):
        if seed is not None:
            torch.manual_seed(seed)
        for batch in dataloader:
            loss = model(**batch).loss.detach().float()
            losses_batch = loss.repeat(batch["input_ids"].shape[0])
            if accelerator is not None:
                losses_batch = accelerator.gather_for_metrics(losses_batch)
            losses.append(losses_batch.cpu())
    model.train(was_training)
    eval_loss = torch.cat(losses).mean().item()
    try:
        perplexity = math.exp(eval_loss)
    except OverflowError:
        perplexity = float("inf")
    return {"eval_loss": eval_loss, "perplexity": perplexity}


def unigram_perplexity(train_counts: np.ndarray, eval_tokens: np.ndarray) -> float:
    """Perplexity of an add-one-smoothed unigram model (Laplace smoothing) on `eval_tokens`.

    `p(w) = (count(w) + 1) / (N + V)` with N training tokens and V = `len(train_counts)`;
    perplexity = `exp(-mean(log p(w)))` over the evaluated tokens.

    Args:
        train_counts: int array `(vocab_size,)` of training-token counts.
        eval_tokens: int array of the evaluated token ids (any shape).

    Returns:
        The perplexity (float, per token).

    Raises:
        ValueError: an evaluated id outside `[0, vocab_size)`, or no evaluated token.
    """
    eval_tokens = np.asarray(eval_tokens).ravel()
    if eval_tokens.size == 0:
        raise ValueError("no tokens to evaluate")
    if eval_tokens.min() < 0 or eval_tokens.max() >= len(train_counts):
        raise ValueError(f"token ids must be in [0, {len(train_counts)})")
    log_probs = np.log(train_counts.astype(np.float64) + 1.0) - math.log(train_counts.sum() + len(train_counts))
    return float(math.exp(-log_probs[eval_tokens].mean()))
