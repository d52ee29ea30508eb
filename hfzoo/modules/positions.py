"""Position information, selected by `config.position_embedding_type`.

Absolute schemes (added to the token embeddings) are registered in `ABSOLUTE_POSITION_EMBEDDINGS`;
`POSITION_EMBEDDING_TYPES` lists every accepted value. Schemes that act on queries/keys or on
attention scores hook into `hfzoo/modules/attention.py`.
"""

from __future__ import annotations

import torch
from torch import nn


class LearnedPositionalEmbedding(nn.Embedding):
    """Learned absolute position embeddings (Vaswani et al. 2017 §3.5; GPT-2's `wpe`, BERT's `position_embeddings`).

    A `(max_position_embeddings, hidden_size)` table indexed by position.

    Shapes:
        `position_ids` `(batch_size, seq_len)` int64 -> `(batch_size, seq_len, hidden_size)`.

    Raises:
        IndexError: (from `nn.Embedding`) a position >= `max_position_embeddings`.
    """

    def __init__(self, config) -> None:
        super().__init__(config.max_position_embeddings, config.hidden_size)


class SinusoidalPositionalEmbedding(nn.Module):
    """Fixed sinusoidal position encodings (Vaswani et al. 2017, §3.5).

    `PE(pos, 2i) = sin(pos / 10000^(2i / d))`, `PE(pos, 2i + 1) = cos(pos / 10000^(2i / d))` with
    `d = hidden_size`, computed on the fly in float32: no parameters and no buffers, so nothing to
    save, load, initialise or partition (DeepSpeed ZeRO-3).

    Shapes:
        `position_ids` `(batch_size, seq_len)` int64 -> `(batch_size, seq_len, hidden_size)` float32.
    """

    def __init__(self, config) -> None:
        super().__init__()
        self.hidden_size = config.hidden_size

    def forward(self, position_ids: torch.Tensor) -> torch.Tensor:
        """Encode `position_ids` `(batch_size, seq_len)` as `(batch_size, seq_len, hidden_size)` sinusoids."""
        half = (self.hidden_size + 1) // 2
        exponent = torch.arange(half, device=position_ids.device, dtype=torch.float32) * 2 / self.hidden_size
        angles = position_ids.float()[..., None] / (10000.0**exponent)  # (batch, seq, half)
        # Interleave sin (even features) and cos (odd features), then drop the extra one for odd sizes.
        return torch.stack([angles.sin(), angles.cos()], dim=-1).flatten(-2)[..., : self.hidden_size]


def build_position_embedding(config) -> nn.Module | None:
    """Build the absolute position embedding for `config.position_embedding_type`, or None if it adds none.

    Args:
        config: an hfzoo config (validated).

    Returns:
        A module mapping `position_ids` `(batch_size, seq_len)` to `(batch_size, seq_len, hidden_size)`
        (`learned`, `sinusoidal`), or None (`none`: no position information at all, a "NoPE" model).
    """
    factory = ABSOLUTE_POSITION_EMBEDDINGS.get(config.position_embedding_type)
    return factory(config) if factory is not None else None


ABSOLUTE_POSITION_EMBEDDINGS = {
    "learned": LearnedPositionalEmbedding,
    "sinusoidal": SinusoidalPositionalEmbedding,
}

POSITION_EMBEDDING_TYPES = ("none", *ABSOLUTE_POSITION_EMBEDDINGS)
