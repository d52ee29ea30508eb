"""GPU runtime settings applied by the training recipes."""

from __future__ import annotations

import logging
import os

import torch

logger = logging.getLogger(__name__)


def disable_cudnn_sdpa() -> bool:
    """Turn off PyTorch's cuDNN attention backend for this process, on CUDA machines, before training.

    With an explicit `attn_mask` (every padded batch: GLUE finetuning, padded evaluation), the cuDNN
    backward kernel that SDPA picks by default on H100/H200 returns NaN query gradients for some
    sequence lengths (`seq_len % 128 == 64`) when a row's log-sum-exp is very negative (pytorch/pytorch
    issue 196678, a regression since torch 2.11). Seen here: an hfzoo decoder finetuned on SST-2 in
    bf16 on an H100 (torch 2.11) got NaN gradients at the first padded batch of 64 tokens, with cuDNN
    only; the memory-efficient, flash and math backends and eager attention stayed finite. SDPA then
    uses those backends instead (forward results are unchanged). `HFZOO_ALLOW_CUDNN_SDPA=1` keeps
    cuDNN attention.

    Returns:
        True if the backend was disabled (a CUDA device is present and the variable is not set).
    """
    if not torch.cuda.is_available() or os.environ.get("HFZOO_ALLOW_CUDNN_SDPA", "") in ("1", "true", "yes"):
        return False
    torch.backends.cuda.enable_cudnn_sdp(False)
    logger.info("cuDNN SDPA disabled (NaN gradients with attention masks, pytorch/pytorch#196678)")
    return True
