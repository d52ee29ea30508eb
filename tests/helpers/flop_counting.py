"""`FlopCounterMode` that also counts in-place matrix products (`addmm_`), for the FLOPs tests.

The chunked cross-entropy of the LM heads (`hfzoo.modules.embeddings.chunked_linear_cross_entropy`)
accumulates the output layer's weight gradient with `Tensor.addmm_`, which torch's counter does not know; it
costs what `addmm` costs (2 FLOPs per multiply-add).
"""

import torch
from torch.utils.flop_counter import FlopCounterMode


def _addmm_flops(self_shape, mat1_shape, mat2_shape, *args, out_shape=None, **kwargs) -> int:
    """`self += mat1 @ mat2`: 2 m k n FLOPs (torch's count for `addmm`, which ignores the addition)."""
    (m, k), (_, n) = mat1_shape, mat2_shape
    return 2 * m * k * n


def flop_counter() -> FlopCounterMode:
    """A silent `FlopCounterMode` counting `aten.addmm_` as torch counts `aten.addmm`."""
    return FlopCounterMode(display=False, custom_mapping={torch.ops.aten.addmm_: _addmm_flops})
