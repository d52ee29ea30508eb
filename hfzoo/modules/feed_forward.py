"""Position-wise feed-forward blocks and the activation registry.

`FeedForward` is the two-layer MLP of Vaswani et al. 2017 (§3.3, eq. 2), or with `config.gated_mlp` the
gated linear unit family (Dauphin et al. 2017; Shazeer 2020, "GLU Variants Improve Transformer", eq. 5-6):

```
dense (gated_mlp=False):  down_proj(act(up_proj(x)))
gated (gated_mlp=True):   down_proj(act(gate_proj(x)) * up_proj(x))
```
The paper's GLU variants are `gated_mlp=True` with `hidden_act` "sigmoid" (GLU), "relu" (ReGLU),
"gelu" (GeGLU; T5 v1.1 uses "gelu_new"), "silu" (SwiGLU) or "linear" (LiGLU, no activation).
Activations are the keys of `ACTIVATIONS` at the bottom of this file: transformers' `ACT2FN` plus the
paper's activations it lacks (elu, selu, softplus). Squared ReLU (So et al. 2021, "Primer: Searching for
Efficient Transformers for Language Modeling", §4: `relu(x)^2`) is `ACT2FN`'s "relu2", dense or gated.
The mixture-of-experts feed-forward is in `experts.py`.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers.activations import ACT2CLS, ClassInstantier, GELUTanh


class FeedForward(nn.Module):
    """The position-wise MLP, dense or gated (see the module docstring).

    Dense: `FFN(x) = act(x W1 + b1) W2 + b2` (Vaswani et al. 2017, eq. 2). Gated: `FFN_GLU(x) =
    (act(x W) * x V) W2` (Shazeer 2020, eq. 6), which adds exactly one `hidden_size x intermediate_size`
    matrix (`gate_proj`, plus its bias with `mlp_bias`); Narang et al. 2021 shrink d_ff to 2048 so that
    the GLU rows keep the baseline's parameter count. Dropout is applied to the hidden layer (after
    the gating), as T5's `T5DenseGatedActDense`: `gate_proj`/`up_proj`/`down_proj` are its `wi_0`/`wi_1`/`wo`.

    Reads `hidden_size`, `intermediate_size` (d_ff), `hidden_act` (a key of `ACTIVATIONS`), `gated_mlp`,
    `mlp_bias` and `activation_dropout` (None: `hidden_dropout_prob`) from the config.

    Shapes:
        input `(batch_size, seq_len, hidden_size)` (or `(num_tokens, hidden_size)`) -> output of the same
        shape and dtype.
    """

    def __init__(self, config) -> None:
        super().__init__()
        bias = config.mlp_bias
        self.gate_proj = (
            nn.Linear(config.hidden_size, config.intermediate_size, bias=bias) if config.gated_mlp else None
        )
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=bias)
        self.act_fn = ACTIVATIONS[config.hidden_act]
        dropout = getattr(config, "activation_dropout", None)
        self.dropout = nn.Dropout(config.hidden_dropout_prob if dropout is None else dropout)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=bias)

    def residual_branch_projections(self) -> tuple[list[nn.Linear], list[nn.Linear]]:
        """`([gate_proj, up_proj], [down_proj])`: what DeepNorm / Fixup initialise (`hfzoo.modules.layer`)."""
        return [proj for proj in (self.gate_proj, self.up_proj) if proj is not None], [self.down_proj]

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """Apply the MLP to `hidden_states` `(..., hidden_size)`."""
        if self.gate_proj is None:
            hidden = self.act_fn(self.up_proj(hidden_states))
        else:
            hidden = self.act_fn(self.gate_proj(hidden_states)) * self.up_proj(hidden_states)
        return self.down_proj(self.dropout(hidden))


# Names -> activation modules: transformers' ACT2FN classes, plus the activations of Narang et al. 2021
# (Table 1) that ACT2FN lacks. Indexing returns a fresh module, as `ACT2FN[name]` does.
# "gelu_new" (GPT-2, T5 v1.1) is the tanh approximation of GELU (Hendrycks & Gimpel 2016, §2): torch's fused
# kernel computes the same formula as transformers' `NewGELUActivation` (within 3e-7 in float32) and saves
# only its input for the backward pass, where the composed version saves 4 intermediate tensors of the
# feed-forward width (48 MiB per layer for GPT-2 at 1,024 tokens in float32).
ACTIVATIONS = ClassInstantier(
    {
        **ACT2CLS,  # includes "relu2", squared ReLU (So et al. 2021, Primer §4; modded-nanogpt)
        "gelu_new": GELUTanh,
        "elu": nn.ELU,  # Clevert et al. 2016
        "selu": nn.SELU,  # Klambauer et al. 2017
        "softplus": nn.Softplus,  # Dugas et al. 2001 / Glorot et al. 2011
    }
)
