"""The Universal Transformer (Dehghani et al. 2019): one block of layers applied recurrently, with ACT halting.

`UniversalTransformerLayerStack` is the `"universal"` entry of `hfzoo.modules.stack.LAYER_STACKS`
(`config.layer_stack`; the encoder-decoder's `decoder_layer_stack`). The stack builds its block
(`num_hidden_layers` layers; the encoder-decoder's decoder `num_decoder_layers`) once per recurrent step,
`num_recurrent_steps` copies whose parameters are tied to the first copy's (so each step owns its KV-cache
layers), and this module applies them:

```
for t in 1..T:                          T = num_recurrent_steps
    state = state + P_pos + S_t         the position signal (the stack's absolute position embedding, if any)
                                        and the timestep signal (Dehghani et al. §2.1 eq. 3; learned, S_t a
                                        row of `step_embeddings`, as Narang et al.'s Mesh TensorFlow setup)
    p_t   = sigmoid(halting(state))     ACT (Graves 2016 §2), per position (adaptive_computation_time=True)
    state = block(state)                the shared layers (self-attention, cross-attention, feed-forward)
    output = ACT-weighted mixture of the states (t2t's `universal_transformer_util` "act" step)
```
Without ACT (`adaptive_computation_time=False`, the "basic" recurrence of tensor2tensor and of Narang et
al. 2021's released configuration) every position takes all T steps and the output is the last state.

`GRUResidualGate` is the `"gru"` entry of `hfzoo.modules.layer.RESIDUAL_GATES` (`config.residual_gating`):
the gating of each sublayer's output that Mesh TensorFlow's `UTLayerStack` applies with
`use_gated_transformer=True, gating_type="gru"`, as in Narang et al.'s Universal Transformer.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import initialization as init

from .norms import build_norm

#: Defaults of the ACT fields (tensor2tensor's `act_epsilon = 0.01` and `act_loss_weight = 0.01`).
ACT_THRESHOLD = 0.99
ACT_LOSS_COEF = 0.01

#: Bias of the halting unit at initialisation (tensor2tensor's `act_halting_bias_init`): sigmoid(1) = 0.73,
#: so positions start by halting after two steps and learn to ponder longer where it lowers the loss.
HALTING_BIAS_INIT = 1.0


class AdaptiveComputationTime:
    """Per-position halting state of Adaptive Computation Time (Graves 2016, §2; Dehghani et al. 2019, §2.2).

    Follows tensor2tensor's `universal_transformer_util._ut_act` ("basic" ACT): at each step a position that
    has not halted adds its halting probability `p`; once the sum would exceed `threshold` the position halts
    and takes the remainder `R = 1 - sum` as its weight, and its output stops changing. At the last step every
    running position halts (Graves's cap N(t) <= M). The output is updated as
    `output = state * w + output * (1 - w)` with `w = p` (running), `R` (halting now) or 0 (halted).
    The ponder cost of a position is `N + R` (Graves eq. 7: the number of steps taken plus the remainder).

    Args:
        halting_probability: `(batch_size, seq_len)` float32 zeros.
        valid: `(batch_size, seq_len)` bool, False at padding (counted as halted from the start), or None.
        threshold: the halting threshold `1 - epsilon`, in (0, 1].
    """

    def __init__(self, halting_probability: torch.Tensor, valid: torch.Tensor | None, threshold: float) -> None:
        self.threshold = threshold
        self.accumulated = halting_probability
        self.remainders = torch.zeros_like(halting_probability)
        self.updates = torch.zeros_like(halting_probability)
        self.running = torch.ones_like(halting_probability, dtype=torch.bool) if valid is None else valid.clone()
        self.valid = valid

    def step(self, probability: torch.Tensor, last: bool) -> torch.Tensor:
        """Advance one step with the halting probabilities `(batch_size, seq_len)`; return the update weights.

        Args:
            probability: `p` of this step, float32 in (0, 1).
            last: this is the last step allowed (every running position halts).

        Returns:
            `(batch_size, seq_len)` float32 weights of this step's state in the output.
        """
        proposed = self.accumulated + probability * self.running
        halting = self.running & ((proposed > self.threshold) | last)
        continuing = self.running & ~halting
        self.accumulated = self.accumulated + probability * continuing
        self.remainders = torch.where(halting, 1.0 - self.accumulated, self.remainders)
        self.accumulated = torch.where(halting, torch.ones_like(self.accumulated), self.accumulated)
        self.updates = self.updates + self.running.float()
        weights = probability * continuing + self.remainders * halting
        self.running = continuing
        return weights

    def all_halted(self) -> bool:
        """Whether every (non-padding) position has halted."""
        return not bool(self.running.any())

    def ponder_cost(self) -> torch.Tensor:
        """Mean of `N + R` over the non-padding positions: float32 scalar (Graves 2016, eq. 7-8)."""
        cost = self.updates + self.remainders
        if self.valid is None:
            return cost.mean()
        return (cost * self.valid).sum() / self.valid.sum().clamp(min=1)


class UniversalTransformerLayerStack(nn.Module):
    """Applies a stack's layers as the Universal Transformer's recurrent block (Dehghani et al. 2019, §2).

    The stack builds `num_recurrent_steps` copies of its block of layers, tied to the first copy
    (`tied_layers`), so that step t's layers own the KV-cache layers of step t; this module runs them step by
    step (see the module docstring). `step_embeddings` (`nn.Embedding(num_recurrent_steps, hidden_size)`) gives
    the timestep signal: Dehghani et al. add a sinusoid of the step (eq. 3), Narang et al.'s configuration a
    learned vector per step (`step_timing_signal_type="learned"`), which hfzoo follows so that the signal starts
    at the scale of the other embeddings (`initializer_range`) instead of swamping them (a sinusoid has unit
    amplitude in every feature). With `adaptive_computation_time`, `halting` (`nn.Linear(hidden_size, 1)`,
    bias initialised to 1) gives each position's halting probability, the output is ACT's weighted mixture of
    the steps' states, and the ponder cost `N + R` (averaged over the real tokens) is returned: the heads add
    `act_loss_coef` times it to the loss (`HfzooPreTrainedModel._add_router_losses`). Without a cache the
    steps stop once every position has halted (outputs do not change after a position halts, so the result
    is the same); with a cache all steps run, so that the cache holds every step's keys and values for the
    tokens that follow (generation with and without the cache gives the same tokens).

    Args:
        config: an hfzoo config (`hidden_size`, `num_recurrent_steps`, `adaptive_computation_time`,
            `act_threshold`).
        layout: the stack's `hfzoo.modules.stack.StackLayout`.

    Shapes:
        `hidden_states` `(batch_size, seq_len, hidden_size)` -> the same, and the ponder cost (float32 scalar,
        or None without ACT).
    """

    def __init__(self, config, layout) -> None:
        super().__init__()
        self.num_steps = config.num_recurrent_steps
        self.threshold = float(config.act_threshold)
        self.step_embeddings = nn.Embedding(config.num_recurrent_steps, config.hidden_size)
        self.halting = nn.Linear(config.hidden_size, 1) if config.adaptive_computation_time else None

    #: the config fields only this layer stack reads (`hfzoo.modules.stack.LayerStack.config_fields`).
    config_fields = ("num_recurrent_steps", "adaptive_computation_time", "act_threshold", "act_loss_coef")

    @staticmethod
    def layer_plan(config, layout, block_size: int) -> list[int]:
        """The block once per recurrent step: layer `i` is a copy of block layer `i mod block_size`."""
        return [i % block_size for i in range(block_size * config.num_recurrent_steps)]

    @staticmethod
    def layer_lengths(config, layout, seq_len: int) -> tuple[list[tuple[int, int]], int]:
        """Every step's layers run at the input's length (all steps: with ACT, the most a position can take)."""
        return [(seq_len, seq_len)] * len(layout.layer_plan(config)), seq_len

    @staticmethod
    def weights_per_token(config, layout) -> int:
        """The halting unit (`hidden_size -> 1`) at every step, with ACT."""
        return config.num_recurrent_steps * config.hidden_size if config.adaptive_computation_time else 0

    @staticmethod
    def check_config(config, layouts) -> None:
        """Refuse bad Universal Transformer fields (`ValueError` naming the field and what is allowed).

        Args:
            config: the hfzoo config being built.
            layouts: the `StackLayout`s of the stacks that use the Universal Transformer.
        """
        steps = config.num_recurrent_steps
        if not isinstance(steps, int) or isinstance(steps, bool) or steps < 1:
            raise ValueError(f"num_recurrent_steps must be a positive integer, got {steps!r}")
        if not isinstance(config.adaptive_computation_time, bool):
            raise ValueError(
                f"adaptive_computation_time must be True or False, got {config.adaptive_computation_time!r}"
            )
        if not 0 < config.act_threshold <= 1:
            raise ValueError(
                f"act_threshold={config.act_threshold!r} must be in (0, 1]: a position halts once its summed "
                "halting probability exceeds it (1 - epsilon in Graves 2016)"
            )
        if config.act_loss_coef < 0:
            raise ValueError(f"act_loss_coef must be >= 0, got {config.act_loss_coef!r}")
        if not config.adaptive_computation_time:
            for name, default in (("act_threshold", ACT_THRESHOLD), ("act_loss_coef", ACT_LOSS_COEF)):
                if getattr(config, name) != default:
                    raise ValueError(
                        f"{name}={getattr(config, name)!r} only applies with adaptive_computation_time=True; "
                        f"leave it at its default {default!r}"
                    )
        if config.num_experts > 0 and config.moe_layer_interval > 1:
            raise ValueError(
                f"layer_stack='universal' applies the same layers at every step, which contradicts experts on "
                f"every {config.moe_layer_interval}-th feed-forward only (moe_layer_interval); use moe_layer_interval=1"
            )

    @staticmethod
    def output_attention_mask(attention_mask: torch.Tensor | None) -> torch.Tensor | None:
        """The stack keeps every position: the mask of its outputs is its input's."""
        return attention_mask

    def init_module_weights(self, config) -> None:
        """Halting unit: weights as any `nn.Linear`, bias 1 (tensor2tensor's `act_halting_bias_init`)."""
        if self.halting is not None:
            init.constant_(self.halting.bias, HALTING_BIAS_INIT)

    def forward(self, stack, hidden_states: torch.Tensor, inputs) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Run the recurrent steps (see the class docstring).

        Args:
            stack: the `HfzooStack` (its `layers` and `embed_positions`).
            hidden_states: `(batch_size, seq_len, hidden_size)` embedded inputs.
            inputs: the stack's `StackInputs` (layer keyword arguments, padding mask, positions, cache).

        Returns:
            `(hidden_states, ponder_cost)`.
        """
        layers = stack.layers
        block = len(layers) // self.num_steps
        position_signal = None
        if stack.embed_positions is not None:  # the absolute position signal, re-added at every step
            position_signal = stack.embed_positions(inputs.position_ids).to(hidden_states.dtype)
        act = None
        if self.halting is not None:
            zeros = hidden_states.new_zeros(hidden_states.shape[:2], dtype=torch.float32)
            act = AdaptiveComputationTime(zeros, inputs.padding_mask, self.threshold)
            output = torch.zeros_like(hidden_states)
        state = hidden_states
        step_signals = self.step_embeddings(torch.arange(self.num_steps, device=state.device)).to(state.dtype)
        for step in range(self.num_steps):
            state = state + step_signals[step]
            if position_signal is not None:
                state = state + position_signal
            if act is not None:
                probability = torch.sigmoid(self.halting(state).float()).squeeze(-1)  # (batch, seq_len)
                weights = act.step(probability, last=step == self.num_steps - 1)
            for layer in layers[step * block : (step + 1) * block]:
                state = layer(state, **inputs.layer_kwargs)
            if act is not None:
                weights = weights[..., None].to(state.dtype)
                output = state * weights + output * (1 - weights)
                if inputs.cache is None and act.all_halted():
                    break
        if act is None:
            return state, None
        return output, act.ponder_cost()


class GRUResidualGate(nn.Module):
    """GRU-style gating of a sublayer's output, as Mesh TensorFlow's Universal Transformer (`gating_type="gru"`).

    With `u` the sublayer's input (as the residual wiring hands it to the sublayer: normalised in pre-norm)
    and `y` its output, `[a; b]` concatenation and N1, N2, N3 the gate's own norms (`config.norm_type`):
    ```
    z = sigmoid(W_z [N1(u); N2(y)] + b_z)          update gate
    r = sigmoid(W_r [N1(u); N2(y)] + b_r)          reset gate
    c = sigmoid(W_c [N3(r * u); N2(y)] + b_c)      candidate (a sigmoid, as Mesh TensorFlow)
    gated = (1 - z) * y + z * c                    added to the residual stream in place of y
    ```
    This is `UTLayerStack.gating` of Mesh TensorFlow, which Narang et al. 2021's Universal Transformer
    enables (`use_gated_transformer=True`); it adds `3 * (2 d^2 + d)` parameters per sublayer, which with one
    shared layer per stack give the paper's 84M. A GRU-type gate in place of the residual sum is the idea of
    Parisotto et al. 2019 ("Stabilizing Transformers for Reinforcement Learning", GTrXL §3).

    Args:
        config: an hfzoo config (`hidden_size`, `norm_type`).

    Shapes:
        `inputs`, `outputs` `(batch_size, seq_len, hidden_size)` -> the same.
    """

    def __init__(self, config) -> None:
        super().__init__()
        hidden = config.hidden_size
        self.update_gate = nn.Linear(2 * hidden, hidden)
        self.reset_gate = nn.Linear(2 * hidden, hidden)
        self.candidate = nn.Linear(2 * hidden, hidden)
        self.input_norm = build_norm(config)
        self.output_norm = build_norm(config)
        self.reset_norm = build_norm(config)

    def forward(self, inputs: torch.Tensor, outputs: torch.Tensor) -> torch.Tensor:
        """Gate the sublayer output `outputs` with its input `inputs` (see the class docstring)."""
        normed_output = self.output_norm(outputs)
        both = torch.cat([self.input_norm(inputs), normed_output], dim=-1)
        update = torch.sigmoid(self.update_gate(both))
        reset = torch.sigmoid(self.reset_gate(both))
        candidate = torch.sigmoid(self.candidate(torch.cat([self.reset_norm(reset * inputs), normed_output], dim=-1)))
        return (1 - update) * outputs + update * candidate
