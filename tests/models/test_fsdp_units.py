"""FSDP2 wrapping units: each model names the layer classes it holds in `_no_split_modules`, which accelerate's
`TRANSFORMER_BASED_WRAP` policy turns into one FSDP unit per layer; no parameter may belong to two units.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from accelerate.utils.fsdp_utils import fsdp2_prepare_auto_wrap_policy
from helpers.variant_checks import build_model
from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy

from hfzoo.modules.stack import LAYER_TYPES

STANDARD = {"num_hidden_layers": 2}
CASES = [
    # (family, overrides, the classes to wrap (empty: the whole model is one unit))
    ("decoder", STANDARD, ["HfzooLayer"]),
    ("encoder", STANDARD, ["HfzooLayer"]),
    ("encoder-decoder", STANDARD, ["HfzooLayer"]),
    ("decoder", {"layer_type": "evolved_transformer"}, ["EvolvedTransformerLayer"]),
    ("encoder-decoder", {"layer_type": "evolved_transformer"}, ["EvolvedTransformerLayer"]),
    ("encoder", {"layer_stack": "funnel"}, ["HfzooLayer"]),
    ("encoder", {"layer_stack": "funnel", "num_hidden_layers": 3, "funnel_block_sizes": [1, 1, 1],
                 "funnel_upsampling_layers": 1}, ["HfzooLayer"]),
    ("decoder", {"layer_stack": "universal", "num_recurrent_steps": 2}, []),
    ("encoder-decoder", {"decoder_layer_stack": "universal", "num_recurrent_steps": 2}, []),
    ("decoder", {"block_sharing": "all"}, []),
    ("encoder-decoder", {"block_sharing": "encoder"}, []),
]  # fmt: skip


def _units(model) -> list:
    """The modules accelerate's FSDP2 transformer auto-wrap policy shards as units (the model itself is one more)."""
    plugin = SimpleNamespace(auto_wrap_policy=transformer_auto_wrap_policy, transformer_cls_names_to_wrap=None)
    policy = fsdp2_prepare_auto_wrap_policy(plugin, model)  # raises for a name no module of the model has
    return [module for module in model.modules() if policy(module)]


@pytest.mark.parametrize("family, overrides, expected", CASES, ids=lambda v: str(v))
def test_each_layer_is_one_unit_and_no_parameter_is_in_two(family, overrides, expected):
    model = build_model(family, overrides)
    assert sorted(model._no_split_modules) == expected
    units = _units(model)
    layers = [m for m in model.modules() if isinstance(m, tuple(LAYER_TYPES.values()))]
    assert len(units) == (len(layers) if expected else 0)
    owner = {}  # parameter -> the innermost unit holding it (None: the root unit)
    for name, param in model.named_parameters(remove_duplicate=False):
        holders = [i for i, unit in enumerate(units) if any(p is param for p in unit.parameters())]
        unit = holders[0] if holders else None
        assert len(holders) <= 1 and owner.setdefault(id(param), unit) == unit, f"{name} is in two FSDP units"


def test_tied_layers_would_put_one_parameter_in_two_units():
    """The check above can fail: wrapping the layers of a block-sharing model puts layer 0's weights in every unit."""
    model = build_model("decoder", {"block_sharing": "all"})
    layers = [m for m in model.modules() if isinstance(m, tuple(LAYER_TYPES.values()))]
    assert len(layers) == 2 and layers[0].self_attn.q_proj.weight is layers[1].self_attn.q_proj.weight
