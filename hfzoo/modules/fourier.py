"""Fourier token mixing: FNet (Lee-Thorp et al. 2022, "FNet: Mixing Tokens with Fourier Transforms").

`FourierMixer` replaces self-attention by the real part of a two-dimensional discrete Fourier transform over
the hidden and the sequence dimensions (§3.2, eq. 3): `y = Re(F_seq(F_hidden(x)))`. It has no parameters.
It is registered as `token_mixer="fourier"` in `hfzoo.modules.mixers.TOKEN_MIXERS`, for bidirectional stacks
only: the transform over the sequence mixes every position into every other, so in a causal stack a token
would see the future (the paper builds encoders only). It has no KV cache, and the config refuses the
position schemes that act inside attention with it (there is no attention).

Padding. The paper's code transforms the whole padded block of `max_seq_length` tokens, so its outputs
depend on how much padding follows a sequence. Here each sequence is transformed over its own tokens only:
a row with n real tokens gets the n-point DFT over those tokens (in order), computed as a product with the
DFT matrix of size n (the paper's TPU path, §3.3) with the padding positions left out; a padded row thus
gives the same outputs as the same row without padding. Without padding (no mask, or no padded position
in the batch) `torch.fft.fft2` computes the same transform in O(n log n). Outputs at padding positions are 0.
"""

from __future__ import annotations

import math

import torch
from torch import nn


def fourier_transform(hidden_states: torch.Tensor, padding_mask: torch.Tensor | None = None) -> torch.Tensor:
    """`Re(F_seq(F_hidden(x)))` of each sequence over its own tokens (Lee-Thorp et al. 2022, eq. 3).

    The DFT is unnormalised, as in the paper (`jnp.fft.fftn`): `F_n[j, k] = exp(-2 pi i j k / n)`.
    Computed in float32 (autocast off).

    Args:
        hidden_states: `(batch_size, seq_len, hidden_size)`, any float dtype.
        padding_mask: `(batch_size, seq_len)` bool, False at padding; or None (every position is a token).
            The real tokens of a row are transformed in their order (their positions need not be contiguous).

    Returns:
        `(batch_size, seq_len, hidden_size)` float32; 0 at padding positions.
    """
    with torch.autocast(device_type=hidden_states.device.type, enabled=False):
        states = hidden_states.float()
        if padding_mask is None or bool(padding_mask.all()):
            return torch.fft.fft2(states, dim=(-2, -1)).real
        over_hidden = torch.fft.fft(states, dim=-1)  # (batch, seq_len, hidden) complex
        cos, sin = sequence_dft_matrices(padding_mask)  # (batch, seq_len, seq_len) each
        # Re((C - iS)(Z_r + i Z_i)) = C Z_r + S Z_i
        return torch.matmul(cos, over_hidden.real) + torch.matmul(sin, over_hidden.imag)


def sequence_dft_matrices(padding_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Real and negated imaginary parts of each row's DFT matrix over its own tokens.

    For a row with n real tokens at ranks `r = 0 .. n-1` (their order among the row's tokens), entry
    `(i, j)` between two real tokens is `cos(2 pi r_i r_j / n)` and `sin(2 pi r_i r_j / n)` (so the DFT
    matrix is `cos - i sin`); entries involving padding are 0. `r_i r_j mod n` is taken in integers, so the
    angles stay exact for long sequences.

    Args:
        padding_mask: `(batch_size, seq_len)` bool, False at padding.

    Returns:
        `(cos, sin)`, each `(batch_size, seq_len, seq_len)` float32.
    """
    real = padding_mask.bool()
    ranks = real.long().cumsum(-1) - 1  # (batch, seq_len): rank of each real token
    lengths = real.sum(-1).clamp(min=1)[:, None, None]  # (batch, 1, 1)
    products = (ranks[:, :, None] * ranks[:, None, :]).remainder(lengths)  # (batch, seq_len, seq_len)
    angles = products.float() * (2 * math.pi / lengths.float())
    pairs = (real[:, :, None] & real[:, None, :]).float()
    return torch.cos(angles) * pairs, torch.sin(angles) * pairs


class FourierMixer(nn.Module):
    """FNet's Fourier sublayer (Lee-Thorp et al. 2022, §3.2): `Re(F_seq(F_hidden(x)))`, no parameters.

    A token mixer (`hfzoo.modules.mixers`), `token_mixer="fourier"`: bidirectional stacks only (the encoder;
    the encoder of the encoder-decoder, whose decoder then needs `decoder_token_mixer`). Padding is left out
    of each sequence's transform (see `fourier_transform`).

    Args:
        config: an hfzoo config (nothing of it is read: the transform has no parameters or sizes of its own).
        layer_idx: the mixer's index among its stack's token mixers.
        is_causal: must be False.

    Raises:
        ValueError: `is_causal=True` (the config refuses it before a model is built).

    Shapes:
        `hidden_states` `(batch_size, seq_len, hidden_size)` -> same shape and dtype.
    """

    def __init__(self, config, layer_idx: int, is_causal: bool) -> None:
        super().__init__()
        if is_causal:
            raise ValueError("FourierMixer mixes every position into every other and cannot run in a causal stack")
        self.layer_idx = layer_idx
        self.is_causal = False

    def residual_branch_projections(self) -> tuple[list[nn.Linear], list[nn.Linear]]:
        """`([], [])`: no projections for DeepNorm / Fixup to rescale."""
        return [], []

    @staticmethod
    def mixer_weights(config) -> int:
        """0: the transform has no weights (`hfzoo.models.flops`; its FFTs are `transform_flops`)."""
        return 0

    @staticmethod
    def attention_pairs(config, seq_len: int) -> int:
        """0: no attention scores (`hfzoo.models.flops`)."""
        return 0

    @staticmethod
    def transform_flops(config, seq_len: int) -> float:
        """Forward FLOPs of the 2-D DFT over one sequence of `seq_len` tokens (read by `hfzoo.models.flops`).

        Each transform is counted as a complex FFT of its length N at 5 N log2 N real FLOPs (the radix-2
        Cooley-Tukey count): an FFT over the hidden dimension at each of the n = `seq_len` positions and one
        over the sequence at each of the d = `hidden_size` channels, `5 n d log2 d + 5 d n log2 n =
        5 n d log2(n d)`. Conventions: the first transform's input is real (a real FFT would take about half)
        and lengths need not be powers of two, neither discounted nor rounded; taking the real part is
        elementwise work (not counted). A padded batch computes the sequence transform as products with the
        DFT matrix (`fourier_transform`); model FLOPs count the FFT regardless.

        Args:
            config: an hfzoo config (`hidden_size`).
            seq_len: tokens of the sequence.

        Returns:
            The forward FLOPs (a float: `log2` of a length that is not a power of two is not whole).
        """
        n, d = seq_len, config.hidden_size
        return 5 * n * d * (math.log2(d) + math.log2(n))

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        cache=None,
        padding_mask: torch.Tensor | None = None,
        position_embeddings=None,
        position_bias=None,
        **kwargs,
    ) -> tuple[torch.Tensor, None]:
        """Mix the tokens of each sequence with the 2-D DFT.

        Args:
            hidden_states: `(batch_size, seq_len, hidden_size)`.
            attention_mask: unused (padding comes from `padding_mask`).
            cache: must be None: the transform has no keys or values a cache or a prefix could extend.
            padding_mask: `(batch_size, seq_len)` bool, False at padding, or None.
            position_embeddings: unused (the config refuses rotary positions with this mixer).
            position_bias: unused (the config refuses score biases with this mixer).
            **kwargs: ignored attention-backend options.

        Returns:
            `(output, None)`: `(batch_size, seq_len, hidden_size)` in the input's dtype, and no attention weights.

        Raises:
            ValueError: `cache` given (e.g. PEFT prefix tuning, which would otherwise be ignored).
        """
        if cache is not None:
            raise ValueError(
                "token_mixer='fourier' has no keys or values, so a cache or a prefix (PEFT prefix tuning) cannot "
                "extend it; finetune with LoRA or fully instead"
            )
        return fourier_transform(hidden_states, padding_mask).to(hidden_states.dtype), None
