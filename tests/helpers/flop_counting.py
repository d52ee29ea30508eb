"""`FlopCounterMode` counting what `hfzoo.models.flops` counts, and the Table 1 rows' configs, for the FLOPs tests.

`row_config(row)` builds a Table 1 row's encoder-decoder config on the smallest base it resolves on.

- The chunked cross-entropy of the LM heads (`hfzoo.modules.embeddings.chunked_linear_cross_entropy`)
  accumulates the output layer's weight gradient with `Tensor.addmm_`, which torch's counter does not know; it
  costs what `addmm` costs (2 FLOPs per multiply-add).
- A depthwise convolution (one group per input channel: `hfzoo.modules.convolutions.depthwise_convolution`,
  one grouped `F.conv1d` for the lightweight convolution and the Evolved Transformer's separable
  convolutions) is elementwise work, `k` multiply-adds per channel and token, which the model-FLOPs
  convention leaves out, as torch's counter leaves out the same multiply-adds written as `mul` and `add` (the
  dynamic convolution's form). Its forward and backward count 0 here; every other convolution keeps torch's
  formulas.
"""

import torch
from torch.utils.flop_counter import FlopCounterMode, conv_backward_flop, conv_flop
from transformers import AutoConfig

from hfzoo.models.narang import resolve_row
from hfzoo.models.presets import build_config


def _addmm_flops(self_shape, mat1_shape, mat2_shape, *args, out_shape=None, **kwargs) -> int:
    """`self += mat1 @ mat2`: 2 m k n FLOPs (torch's count for `addmm`, which ignores the addition)."""
    (m, k), (_, n) = mat1_shape, mat2_shape
    return 2 * m * k * n


def _is_depthwise(x_shape, w_shape, transposed: bool, groups: int) -> bool:
    """One group per input channel, one input channel per filter: `(C, 1, k)` weights on `(B, C, L)` inputs."""
    return not transposed and groups > 1 and groups == x_shape[1] and w_shape[1] == 1


def _conv_flops(x_shape, w_shape, *args, **kwargs) -> int:
    """torch's convolution count, 0 for a depthwise convolution."""
    _bias, _stride, _padding, _dilation, transposed, _output_padding, groups = args[:7]
    if _is_depthwise(x_shape, w_shape, transposed, groups):
        return 0
    return conv_flop.__wrapped__(x_shape, w_shape, *args, **kwargs)  # torch's formula, before its shape wrapper


def _conv_backward_flops(grad_out_shape, x_shape, w_shape, *args, **kwargs) -> int:
    """torch's convolution-backward count, 0 for a depthwise convolution."""
    _bias, _stride, _padding, _dilation, transposed, _output_padding, groups = args[:7]
    if _is_depthwise(x_shape, w_shape, transposed, groups):
        return 0
    return conv_backward_flop.__wrapped__(grad_out_shape, x_shape, w_shape, *args, **kwargs)


def flop_counter() -> FlopCounterMode:
    """A silent `FlopCounterMode` counting `aten.addmm_` as `aten.addmm`, and depthwise convolutions as 0."""
    return FlopCounterMode(
        display=False,
        custom_mapping={
            torch.ops.aten.addmm_: _addmm_flops,
            torch.ops.aten.convolution: _conv_flops,
            torch.ops.aten.convolution_backward: _conv_backward_flops,
        },
    )


# Small bases for the row check: two layers where the row resolves on them; six layers and heads for the depth
# rows (which scale layers and heads by 2, 3/2, 2/3 and 1/2). FlopCounterMode is slow, so the smaller the better.
ROW_BASES = [
    dict(
        hidden_size=16,
        num_hidden_layers=2,
        num_decoder_layers=2,
        num_attention_heads=2,
        head_dim=4,
        intermediate_size=24,
        vocab_size=64,
    ),
    dict(
        hidden_size=24,
        num_hidden_layers=6,
        num_decoder_layers=6,
        num_attention_heads=6,
        head_dim=4,
        intermediate_size=48,
        vocab_size=64,
    ),
]


def row_config(row: str):
    """The row's config on the smallest base it resolves on."""
    for fields in ROW_BASES:
        base = build_config("narang-vanilla", fields).to_dict()
        for key in ("model_type", "transformers_version", "architectures", "num_key_value_heads"):
            base.pop(key, None)  # (multi-head attention follows a row's number of heads)
        try:
            fields = {**base, **resolve_row(row, base)}
        except ValueError:
            continue
        if fields.get("router_type") == "switch":  # no token over capacity: every token reaches its expert
            fields["expert_capacity_factor"] = fields["num_experts"]
        if fields.get("moe_layer_interval", 1) > fields["num_hidden_layers"]:
            fields["moe_layer_interval"] = fields["num_hidden_layers"]  # keep one expert layer per stack
        return AutoConfig.for_model("hfzoo_encoder_decoder", **fields)
    raise AssertionError(f"{row} resolves on none of the bases")
