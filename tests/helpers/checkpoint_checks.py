"""Checks run in a fresh Python process on a saved causal-LM checkpoint (used by test_pretrain_recipe).

Usage: python tests/helpers/checkpoint_checks.py CHECKPOINT_DIR  -> prints one JSON line of results.
"""

import json
import sys

import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

import hfzoo  # noqa: F401

path = sys.argv[1]
tokenizer = AutoTokenizer.from_pretrained(path)
eager = AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager").eval()
sdpa = AutoModelForCausalLM.from_pretrained(path, attn_implementation="sdpa").eval()
stored = load_file(f"{path}/model.safetensors")
state = eager.state_dict()
weights_exact = all(torch.equal(state[k], v) for k, v in stored.items())

inputs = tokenizer(["It was a dark and stormy night", "The"], return_tensors="pt", padding=True)
with torch.no_grad():
    a = eager(**inputs).logits
    b = sdpa(**inputs).logits
mask = inputs["attention_mask"].bool()
eager_sdpa_max_diff = (a[mask] - b[mask]).abs().max().item()

ids = tokenizer("It was a dark and stormy night, and the rain fell in torrents", return_tensors="pt").input_ids
with torch.no_grad():
    base = eager(ids).logits
    t = ids.shape[1] // 2
    changed = ids.clone()
    changed[:, t + 1 :] = (changed[:, t + 1 :] + 7) % len(tokenizer)
    causal_max_diff = (eager(changed).logits[:, : t + 1] - base[:, : t + 1]).abs().max().item()
    prompt = tokenizer("It was a dark and stormy night", return_tensors="pt")
    kwargs = dict(max_new_tokens=32, min_new_tokens=32, do_sample=False)
    with_cache = eager.generate(**prompt, use_cache=True, **kwargs)
    without_cache = eager.generate(**prompt, use_cache=False, **kwargs)
print(
    json.dumps(
        {
            "weights_exact": weights_exact,
            "eager_sdpa_max_diff": eager_sdpa_max_diff,
            "causal_max_diff": causal_max_diff,
            "new_tokens": with_cache.shape[1] - prompt.input_ids.shape[1],
            "cache_equal": torch.equal(with_cache, without_cache),
        }
    )
)
