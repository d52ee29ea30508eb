#!/usr/bin/env python
r"""Check a GGUF export with llama.cpp itself: same prompt tokens, same greedy tokens as transformers.

    python scripts/check_gguf_llama_cpp.py --model_name_or_path outputs/gutenberg-llama/llama \
        --gguf outputs/gutenberg-llama/gguf/model-f32.gguf --max_new_tokens 32

For each GGUF file and each prompt it

1. tokenizes the prompt with the folder's tokenizer (special tokens added as the tokenizer adds them) and with
   llama.cpp (`Llama.tokenize(add_bos=True)`, which adds the bos / eos tokens that the file's
   `tokenizer.ggml.add_bos_token` / `add_eos_token` ask for), and compares the ids; the texts of `--tokenizer_text`
   are compared the same way, without generating;
2. generates `--max_new_tokens` tokens greedily from the tokenizer's ids on both sides: transformers'
   `generate(do_sample=False)` on the folder's model, and llama.cpp by evaluating the same ids and taking the
   arg max of its logits at each step (a generated eos token ends both), then compares the token ids and prints
   the largest absolute difference of the two sides' logits over the steps where the sequences agree
   (llama.cpp keeps its key/value cache in float16 unless `--cache_type f32`), and the smallest margin between
   transformers' two best logits over the steps (a logit difference above it could change a greedy token).

It prints one block per file and prompt and exits with 1 when any prompt's tokens or generated tokens differ,
2 on bad arguments. The model folder is a native `LlamaForCausalLM` / `Qwen3ForCausalLM` folder (as
`hfzoo-convert` writes it) or an hfzoo decoder folder (hfzoo is then imported to register its model type).

Needs llama.cpp's Python binding, which builds llama.cpp from source: `pip install llama-cpp-python`. The check
runs on CPU, one thread by default (`--n_threads`).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

DEFAULT_PROMPTS = [
    "It was a dark and stormy night, and",
    "The old man looked at the sea and said",
    "Chapter I. In the year 1815, Monseigneur",
]
DEFAULT_TOKENIZER_TEXTS = [
    "Byte-level BPE keeps every byte: café, naïve, 東京, emoji 🚀, tabs\tand\nnewlines.",
    "  Two leading spaces, 12,345.67 numbers, it's, we'll, they'd -- and   runs   of spaces.\n\n",
]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (see the module docstring); argparse exits with 2 on bad arguments."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model_name_or_path", required=True, help="native Llama / Qwen3 folder or hfzoo decoder folder")
    p.add_argument("--gguf", required=True, nargs="+", help="one or more .gguf files exported from that model")
    p.add_argument("--prompt", action="append", help=f"a prompt (repeatable; default: {len(DEFAULT_PROMPTS)} prompts)")
    p.add_argument("--tokenizer_text", action="append", help="a text whose tokenization alone is compared (repeatable)")
    p.add_argument("--max_new_tokens", type=int, default=32)
    p.add_argument("--n_ctx", type=int, default=256, help="llama.cpp's context size")
    p.add_argument("--n_threads", type=int, default=1, help="llama.cpp's CPU threads")
    p.add_argument(
        "--cache_type",
        choices=["f16", "f32"],
        default="f16",
        help="llama.cpp's key/value cache type (its --cache-type-k / -v; default f16, as llama.cpp)",
    )
    p.add_argument("--output_file", default=None, help="also write the results as JSON")
    args = p.parse_args(argv)
    if args.max_new_tokens < 1:
        p.error(f"--max_new_tokens {args.max_new_tokens}: expected a positive number")
    for path in args.gguf:
        if not Path(path).is_file():
            p.error(f"--gguf {path}: no such file")
    args.prompt = args.prompt or DEFAULT_PROMPTS
    args.tokenizer_text = args.tokenizer_text or DEFAULT_TOKENIZER_TEXTS
    return args


def import_llama_cpp():
    """Import llama.cpp's Python binding, or exit with an install hint."""
    try:
        import llama_cpp
    except ImportError:
        sys.exit("error: this check needs llama.cpp's Python binding: pip install llama-cpp-python")
    return llama_cpp


def load_transformers_model(path: str):
    """The folder's tokenizer and causal LM (float32, eval mode); imports hfzoo for an hfzoo folder."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    if AutoConfig.from_pretrained(path).model_type.startswith("hfzoo"):
        import hfzoo  # noqa: F401  (registers the hfzoo model types)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    return AutoTokenizer.from_pretrained(path), model


def transformers_greedy(model, tokenizer, ids: list[int], max_new_tokens: int) -> tuple[list[int], list]:
    """The greedy continuation of `ids` by transformers of `ids`: the new token ids and the raw logits of each step."""
    import torch
    from transformers import GenerationConfig

    config = GenerationConfig(
        max_new_tokens=max_new_tokens,
        do_sample=False,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id,
        output_logits=True,
        return_dict_in_generate=True,
    )
    with torch.no_grad():
        out = model.generate(
            torch.tensor([ids]),
            attention_mask=torch.ones(1, len(ids), dtype=torch.long),
            generation_config=config,
        )
    new = out.sequences[0, len(ids) :].tolist()
    return new, [step[0].float().numpy() for step in out.logits]


def llama_cpp_greedy(llm, ids: list[int], max_new_tokens: int, eos_id: int | None) -> tuple[list[int], list]:
    """llama.cpp's greedy continuation of `ids` (arg max of its logits): the new token ids and each step's logits."""
    import numpy as np

    llm.reset()
    llm.eval(ids)
    new, logits = [], []
    for _ in range(max_new_tokens):
        step = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)
        logits.append(step)
        token = int(step.argmax())
        new.append(token)
        if token == eos_id:
            break
        llm.eval([token])
    return new, logits


def check_file(llama_cpp, gguf_path: str, tokenizer, model, args: argparse.Namespace) -> dict:
    """Compare one GGUF file with the transformers model on every prompt and tokenizer text; returns the results."""
    import numpy as np

    cache_type = {"f16": llama_cpp.GGML_TYPE_F16, "f32": llama_cpp.GGML_TYPE_F32}[args.cache_type]
    llm = llama_cpp.Llama(
        model_path=gguf_path,
        n_ctx=args.n_ctx,
        n_threads=args.n_threads,
        type_k=cache_type,
        type_v=cache_type,
        logits_all=True,
        seed=0,
        verbose=False,
    )
    result = {"gguf": gguf_path, "tokenizer_texts": [], "prompts": []}
    for text in args.tokenizer_text:
        hf_ids = tokenizer(text)["input_ids"]
        cpp_ids = llm.tokenize(text.encode("utf-8"), add_bos=True, special=False)
        result["tokenizer_texts"].append({"text": text, "equal": hf_ids == cpp_ids, "hf": hf_ids, "llama_cpp": cpp_ids})
    for prompt in args.prompt:
        hf_ids = tokenizer(prompt)["input_ids"]
        cpp_ids = llm.tokenize(prompt.encode("utf-8"), add_bos=True, special=False)
        hf_new, hf_logits = transformers_greedy(model, tokenizer, hf_ids, args.max_new_tokens)
        cpp_new, cpp_logits = llama_cpp_greedy(llm, hf_ids, args.max_new_tokens, tokenizer.eos_token_id)
        agree = 0
        while agree < min(len(hf_new), len(cpp_new)) and hf_new[agree] == cpp_new[agree]:
            agree += 1
        steps = min(agree + 1, len(hf_logits), len(cpp_logits))  # logits before the first difference are comparable
        diff = max(float(np.abs(hf_logits[i] - cpp_logits[i][: hf_logits[i].shape[0]]).max()) for i in range(steps))
        result["prompts"].append({
            "prompt": prompt,
            "prompt_tokens_equal": hf_ids == cpp_ids,
            "prompt_tokens": {"hf": hf_ids, "llama_cpp": cpp_ids},
            "generated_equal": hf_new == cpp_new,
            "first_difference": None if hf_new == cpp_new else agree,
            "max_abs_logit_difference": diff,
            "smallest_top2_margin": min(float(np.diff(np.sort(step)[-2:])[0]) for step in hf_logits),
            "hf": hf_new,
            "llama_cpp": cpp_new,
            "hf_text": tokenizer.decode(hf_new),
            "llama_cpp_text": llm.detokenize(cpp_new, special=True).decode("utf-8", errors="replace"),
        })  # fmt: skip
    llm.close()
    return result


def report(result: dict) -> bool:
    """Print one file's results; True when every tokenization and every greedy sequence matched."""
    ok = True
    print(f"== {result['gguf']}")
    for t in result["tokenizer_texts"]:
        ok &= t["equal"]
        print(f"tokenizer text {t['text']!r}: {len(t['hf'])} tokens, {'equal' if t['equal'] else 'DIFFERENT'}")
        if not t["equal"]:
            print(f"  transformers {t['hf']}\n  llama.cpp    {t['llama_cpp']}")
    for r in result["prompts"]:
        ok &= r["prompt_tokens_equal"] and r["generated_equal"]
        tokens = r["prompt_tokens"]
        print(f"prompt {r['prompt']!r}: prompt tokens {'equal' if r['prompt_tokens_equal'] else 'DIFFERENT'} "
              f"({len(tokens['hf'])} tokens)")  # fmt: skip
        if not r["prompt_tokens_equal"]:
            print(f"  transformers {tokens['hf']}\n  llama.cpp    {tokens['llama_cpp']}")
        verdict = "equal" if r["generated_equal"] else f"DIFFERENT from new token {r['first_difference']}"
        print(f"  greedy tokens {verdict}; max |logit difference| {r['max_abs_logit_difference']:.3g} "
              "over the steps before any difference; transformers' closest step: best two logits "
              f"{r['smallest_top2_margin']:.3g} apart")  # fmt: skip
        print(f"  transformers ({len(r['hf'])}): {r['hf']}\n    {r['hf_text']!r}")
        print(f"  llama.cpp    ({len(r['llama_cpp'])}): {r['llama_cpp']}\n    {r['llama_cpp_text']!r}")
    return ok


def main(argv: list[str] | None = None) -> int:
    """Run the check (see the module docstring); 0 when everything matched, 1 otherwise.

    Raises:
        SystemExit: llama-cpp-python is not installed, or a prompt does not fit `--n_ctx` with its new tokens.
    """
    args = parse_args(argv)
    llama_cpp = import_llama_cpp()
    print(f"llama-cpp-python {llama_cpp.__version__}, {args.cache_type} key/value cache; {args.model_name_or_path}")
    tokenizer, model = load_transformers_model(args.model_name_or_path)
    for prompt in args.prompt:
        if len(tokenizer(prompt)["input_ids"]) + args.max_new_tokens > args.n_ctx:
            sys.exit(f"error: --prompt {prompt!r}: its tokens and --max_new_tokens {args.max_new_tokens} exceed "
                     f"--n_ctx {args.n_ctx}")  # fmt: skip
    results = [check_file(llama_cpp, path, tokenizer, model, args) for path in args.gguf]
    ok = all([report(r) for r in results])
    if args.output_file:
        Path(args.output_file).write_text(json.dumps(results, indent=1, ensure_ascii=False))
    print("all equal" if ok else "some tokens differ")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
