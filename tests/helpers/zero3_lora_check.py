"""LoRA adapters and full weights saved from a 2-process DeepSpeed ZeRO-3 run (test helper).

Usage: accelerate launch --config_file accelerate_configs/deepspeed_zero3.yaml tests/helpers/zero3_lora_check.py OUT
Trains a tiny hfzoo decoder with a peft LoRA adapter for 3 steps under ZeRO-3, saves the adapter
(peft `save_pretrained`) and the full weights from `accelerator.get_state_dict`, and on the main process
prints one JSON line comparing every saved tensor with the parameters gathered from the partitions.
"""

import json
import sys
from pathlib import Path

import deepspeed
import torch
from accelerate import Accelerator
from accelerate.utils import InitProcessGroupKwargs
from peft import LoraConfig, get_peft_model
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from hfzoo.models.presets import build_config

out = Path(sys.argv[1])
accelerator = Accelerator(kwargs_handlers=[InitProcessGroupKwargs(backend="gloo")])
config = build_config(
    "decoder-tiny",
    "hidden_size=32,num_hidden_layers=2,num_attention_heads=2,intermediate_size=64,max_position_embeddings=64,"
    "vocab_size=64",
)
torch.manual_seed(0)
model = get_peft_model(
    AutoModelForCausalLM.from_config(config), LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])
)
optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
loader = torch.utils.data.DataLoader(torch.randint(0, 64, (12, 16)), batch_size=2)
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
for batch in loader:
    loss = model(input_ids=batch, labels=batch).loss
    accelerator.backward(loss)
    optimizer.step()
    optimizer.zero_grad()

state_dict = accelerator.get_state_dict(model)  # gathered from the ZeRO-3 partitions (collective)
unwrapped = accelerator.unwrap_model(model)
unwrapped.save_pretrained(out / "adapter", state_dict=state_dict, is_main_process=accelerator.is_main_process)
with deepspeed.zero.GatheredParameters(list(unwrapped.parameters())):
    gathered = {name: p.detach().clone() for name, p in unwrapped.named_parameters()}
accelerator.wait_for_everyone()
if accelerator.is_main_process:
    adapter = load_file(out / "adapter" / "adapter_model.safetensors")
    lora_names = {n for n in gathered if "lora_" in n}
    adapter_equal = {
        name: torch.equal(tensor, gathered[name.replace(".weight", ".default.weight")])
        for name, tensor in adapter.items()
    }
    full_equal = {name: torch.equal(state_dict[name], gathered[name]) for name in gathered}
    print(
        json.dumps(
            {
                "adapter_tensors": len(adapter),
                "lora_parameters": len(lora_names),
                "adapter_min_numel": min(t.numel() for t in adapter.values()),
                "adapter_equal": all(adapter_equal.values()),
                "lora_B_trained": any(t.abs().sum() > 0 for n, t in adapter.items() if "lora_B" in n),
                "full_tensors": len(state_dict),
                "full_min_numel": min(t.numel() for t in state_dict.values()),
                "full_equal": all(full_equal.values()),
                "full_parameters": len(gathered),
            }
        )
    )
accelerator.end_training()
