"""Logit soft-capping (Gemma 2 Team 2024, "Gemma 2: Improving Open Language Models at a Practical Size", §2).

`soft_cap(x, cap) = cap * tanh(x / cap)` keeps every logit in `(-cap, cap)` while leaving small ones almost
unchanged (slope 1 at 0). Two config fields, with transformers' Gemma 2 names:

- `attn_logit_softcapping`: the attention scores `Q K^T * scaling` of every `HfzooAttention` (self- and
  cross-attention), capped before the score bias (T5's relative bias, ALiBi) and the mask are added
  (`hfzoo.modules.attention`). A tanh on each score is not something SDPA can apply: the backends that can
  are `SOFTCAPPING_BACKENDS` (eager; FlexAttention through its `score_mod`; flash-attention's `softcap`
  argument). With the cap set, the model reports the other backends as unsupported, so transformers falls back
  from its default SDPA to eager (as for Gemma 2) and refuses an explicit `attn_implementation="sdpa"`;
  the attention refuses at run time, naming the backend, a backend switched to by hand.
- `final_logit_softcapping`: the vocabulary scores of every language-model head
  (`hfzoo.modules.embeddings.VocabProjection`), in the logits, in the chunked cross-entropy used in training
  (`chunked_linear_cross_entropy(..., softcap=)`) and therefore in `generate()`.

A cap must be positive (or None: no capping). The token mixers that apply the attention cap say so in their
`hfzoo.modules.mixers.TokenMixer.score_options`.
"""

from __future__ import annotations

import torch

#: The attention backends (`config._attn_implementation`) that apply `attn_logit_softcapping`.
SOFTCAPPING_BACKENDS = ("eager", "flex_attention", "flash_attention")


def soft_cap(logits: torch.Tensor, cap: float | None) -> torch.Tensor:
    """`cap * tanh(logits / cap)` (Gemma 2 §2), or `logits` unchanged when `cap` is None.

    Args:
        logits: any shape and floating dtype (computed in that dtype, as transformers' Gemma 2).
        cap: the positive cap, or None.

    Returns:
        A tensor of the shape and dtype of `logits`, in `(-cap, cap)`.
    """
    if cap is None:
        return logits
    return torch.tanh(logits / cap) * cap


def supports_attention_softcapping(backend: str) -> bool:
    """Whether the attention backend `backend` (`flash_attention_2` counts as `flash_attention`) applies the cap."""
    return any(backend.startswith(name) for name in SOFTCAPPING_BACKENDS)


def check_softcapping_config(config) -> None:
    """Refuse a cap that is not None or a positive number, and a final cap on a head that returns log-probabilities.

    Args:
        config: an hfzoo config (`attn_logit_softcapping`, `final_logit_softcapping`, `num_softmaxes`,
            `adaptive_softmax_cutoffs`, `adaptive_input_cutoffs`, `tie_word_embeddings`).

    Raises:
        ValueError: naming the field, its value and what is allowed.
    """
    for name in ("attn_logit_softcapping", "final_logit_softcapping"):
        value = getattr(config, name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0):
            raise ValueError(f"{name}={value!r} must be None (no capping) or a positive number (the cap)")
    if config.final_logit_softcapping is None:
        return
    if config.num_softmaxes > 1:
        raise ValueError(
            f"final_logit_softcapping={config.final_logit_softcapping!r} caps logits, but num_softmaxes="
            f"{config.num_softmaxes} makes the LM head return log-probabilities; use num_softmaxes=1 or "
            "final_logit_softcapping=None"
        )
    if config.adaptive_softmax_cutoffs is not None:
        raise ValueError(
            f"final_logit_softcapping={config.final_logit_softcapping!r} caps logits, but adaptive_softmax_cutoffs "
            "makes the LM head return log-probabilities; use final_logit_softcapping=None"
        )
    if config.adaptive_input_cutoffs is not None and config.tie_word_embeddings:
        raise ValueError(
            f"final_logit_softcapping={config.final_logit_softcapping!r} is applied by the plain vocabulary "
            "projection, not by the head tied to adaptive input embeddings (adaptive_input_cutoffs with "
            "tie_word_embeddings=True); untie it or use final_logit_softcapping=None"
        )
