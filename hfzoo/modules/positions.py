"""Position information, selected by `config.position_embedding_type`.

Absolute schemes (added to the token embeddings) are registered in `ABSOLUTE_POSITION_EMBEDDINGS`;
`POSITION_EMBEDDING_TYPES` lists every accepted value. Schemes that act on queries/keys or on
attention scores hook into `hfzoo/modules/attention.py`.
"""

from __future__ import annotations

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


def build_position_embedding(config) -> nn.Module | None:
    """Build the absolute position embedding for `config.position_embedding_type`, or None if it adds none.

    Args:
        config: an hfzoo config (validated).

    Returns:
        A module mapping `position_ids` `(batch_size, seq_len)` to `(batch_size, seq_len, hidden_size)`,
        or None (`none`: no position information at all, a "NoPE" model).
    """
    factory = ABSOLUTE_POSITION_EMBEDDINGS.get(config.position_embedding_type)
    return factory(config) if factory is not None else None


ABSOLUTE_POSITION_EMBEDDINGS = {
    "learned": LearnedPositionalEmbedding,
}

POSITION_EMBEDDING_TYPES = ("none", *ABSOLUTE_POSITION_EMBEDDINGS)
