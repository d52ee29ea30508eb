"""Connections across the layers of one stack: value residual learning and U-Net skips (modded-nanogpt).

Both are switches of the whole stack (`config.value_residual`, `config.unet_skips`), applied by the standard
layer stack (`hfzoo.modules.stack.StandardLayerStack`) within one forward pass; where they are defined is
written in the `LAYER_STACKS` and `TOKEN_MIXERS` entries and checked by
`hfzoo.modules.stack.check_layer_connections` when the config is built.

- **Value residual learning** (ResFormer; Zhou et al. 2024, "Value Residual Learning For Alleviating
  Attention Concentration in Transformers", §3, eq. of ResFormer): the values of every token mixer after the
  first are mixed with the first one's, `V_n' = lambda_1 V_n + lambda_2 V_1`, per head and before attention
  (`ValueResidual`). The paper's ResFormer fixes lambda_1 = lambda_2 = 0.5; its learnable variant and the
  GPT-2 speedrun (modded-nanogpt, Jordan et al. 2024) learn them: here two learned scalars per later token
  mixer, initialised at 0.5 / 0.5, so training starts from the paper's fixed mixing. The mixing happens before
  the KV cache stores the values, so the cache holds the mixed values and decoding with a cache equals
  decoding without one.
- **U-Net skips** (Ronneberger et al. 2015, "U-Net", §2; as in modded-nanogpt's speedrun records): the output
  of layer i of the first half of the stack is added, times a learned scalar initialised at 1 (modded-nanogpt's
  `skip_weights = ones`), to the input of layer L-1-i of the second half (`UNetSkips`). With an odd number of
  layers L the middle layer (L-1)/2 would be its own mirror: it takes no skip and stores none, so
  `L // 2` skips connect the first `L // 2` layers to the last `L // 2`.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import initialization as init


class ValueResidual(nn.Module):
    """The learned mixing weights of value residual learning (ResFormer, Zhou et al. 2024) of one stack.

    `lambdas[n - 1] = (lambda_1, lambda_2)` of token mixer n (n = 1 .. num_mixers - 1, counted from 0 as the
    KV-cache index `layer_idx`): `V_n' = lambda_1 V_n + lambda_2 V_1`. Token mixer 0 records its values `V_1`
    (unchanged) in a dict the layer stack creates for each forward pass; the later ones read them. The
    attention module calls it as `value_residual(value)` (a `functools.partial` binding `first_values` and
    `mixer_idx`), so the parameters are read only in this module's `forward` (DeepSpeed ZeRO-3 gathers per
    module). Under gradient checkpointing the backward pass recomputes token mixer 0, which records the same
    values again; the later mixers' saved inputs are those of the forward pass.

    Args:
        num_mixers: token mixers of the stack (at least 2).

    Shapes:
        `value` `(batch_size, num_heads, seq_len, head_dim)` -> same shape and dtype.
    """

    def __init__(self, num_mixers: int) -> None:
        super().__init__()
        self.lambdas = nn.Parameter(torch.full((num_mixers - 1, 2), 0.5))

    def init_module_weights(self, config) -> None:
        """lambda_1 = lambda_2 = 0.5 (ResFormer's fixed mixing; modded-nanogpt's initialisation)."""
        init.constant_(self.lambdas, 0.5)

    def forward(self, first_values: dict, mixer_idx: int, value: torch.Tensor) -> torch.Tensor:
        """Record (token mixer 0) or mix in (later ones) the first token mixer's values.

        Args:
            first_values: the dict of this forward pass; token mixer 0 stores its values under `"values"`.
            mixer_idx: the token mixer's index in its stack (its `layer_idx`).
            value: `(batch_size, num_heads, seq_len, head_dim)`, the mixer's new values (cached ones excluded).

        Returns:
            `value` for token mixer 0, else `lambda_1 * value + lambda_2 * V_1`, in `value`'s dtype.

        Raises:
            RuntimeError: a later token mixer runs before token mixer 0 in this forward pass.
        """
        if mixer_idx == 0:
            first_values["values"] = value
            return value
        if "values" not in first_values:
            raise RuntimeError(f"value residual: token mixer {mixer_idx} ran before the stack's first token mixer")
        weights = self.lambdas[mixer_idx - 1].to(value.dtype)
        return weights[0] * value + weights[1] * first_values["values"]

    def extra_repr(self) -> str:
        """Show the number of mixed token mixers in `print(model)`."""
        return f"mixed_token_mixers={self.lambdas.shape[0]}"


class UNetSkips(nn.Module):
    """The learned weights of the U-Net skips of one stack (Ronneberger et al. 2015; modded-nanogpt).

    `weight[i]` scales the skip from the output of layer i (first half) to the input of layer L-1-i (second
    half), i = 0 .. L//2 - 1; initialised at 1 as modded-nanogpt's `skip_weights`. The layer stack stores the
    first half's outputs and calls this module before each second-half layer.

    Args:
        num_layers: L, the layers of the stack (at least 2).

    Shapes:
        `hidden_states`, `skip` `(batch_size, seq_len, hidden_size)` -> `(batch_size, seq_len, hidden_size)`.
    """

    def __init__(self, num_layers: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(num_layers // 2))

    def init_module_weights(self, config) -> None:
        """Every skip weight at 1 (modded-nanogpt)."""
        init.ones_(self.weight)

    @staticmethod
    def mirror(num_layers: int, index: int) -> int | None:
        """The first-half layer whose output layer `index` takes as a skip: `L - 1 - index`, or None.

        None for the first half and, with an odd L, the middle layer.
        """
        source = num_layers - 1 - index
        return source if source < index and source < num_layers // 2 else None

    def forward(self, hidden_states: torch.Tensor, skip: torch.Tensor, source: int) -> torch.Tensor:
        """`hidden_states + weight[source] * skip`: the input of layer L-1-source with its skip added."""
        return hidden_states + self.weight[source].to(skip.dtype) * skip
