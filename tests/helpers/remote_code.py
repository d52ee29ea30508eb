"""Loading exported checkpoints with `trust_remote_code=True` in a clean interpreter WITHOUT hfzoo.

The clean interpreter (the session fixture `clean_python` in `conftest.py`, built by
`clean_env.make_clean_venv`) sees this venv's site-packages but not hfzoo's editable-install hook, so
`import hfzoo` fails there (reported by the script).

`run_remote_code(python, job, workdir)` runs `CLEAN_ENV_SCRIPT` once for a whole job: every model of the
job is loaded with its Auto class, run on named input tensors, and its first output written to one
safetensors file, so that many checkpoints cost one interpreter start (used by `tests/test_export.py`
and by the variant matrix in `tests/models/test_variants.py`).
"""

from __future__ import annotations

import textwrap
from pathlib import Path

from helpers import clean_env

# Runs in the clean interpreter: argv[1] is the path of a JSON job; prints one JSON line; writes outputs to a file.
# A job: {"models": [entry, ...], "inputs": file, "outputs": file, "threads": int, "keep_going": bool,
# "tokenizer_dir"/"text" (optional)}. An entry: {"auto": Auto class name, "dir": folder, "inputs": [names] or
# {argument: tensor name}, "key": output name (default: auto), "code_dir": an exported folder whose remote
# code loads this entry's `save_pretrained` folder "dir" (the class is imported once per code_dir),
# "resave": folder, "generate": bool}. With keep_going, an entry that fails is reported in
# result["errors"][key] and the others still run.
CLEAN_ENV_SCRIPT = textwrap.dedent(
    """
    import json, sys, traceback

    job = json.loads(open(sys.argv[1]).read())  # the job file (clean_env.run_clean)
    result = {"errors": {}}
    try:
        import hfzoo  # noqa: F401
        result["hfzoo"] = "importable from " + str(hfzoo.__file__)
    except ModuleNotFoundError:
        result["hfzoo"] = "ModuleNotFoundError"

    import torch
    import transformers
    from safetensors.torch import load_file, save_file

    torch.set_num_threads(job["threads"])
    result["transformers"] = transformers.__version__
    inputs = load_file(job["inputs"])
    outputs, result["classes"], result["config_classes"] = {}, {}, {}
    remote_classes = {}  # code_dir -> the model class its remote code defines


    def run(entry):
        key = entry.get("key", entry["auto"])
        names = entry["inputs"] if isinstance(entry["inputs"], dict) else {name: name for name in entry["inputs"]}
        model_inputs = {argument: inputs[name] for argument, name in names.items()}
        auto_class = getattr(transformers, entry["auto"])
        load = dict(attn_implementation="eager", dtype=torch.float32)
        if entry.get("code_dir"):  # weights saved by save_pretrained, classes from an exported folder's code
            if entry["code_dir"] not in remote_classes:
                code = auto_class.from_pretrained(entry["code_dir"], trust_remote_code=True, **load)
                remote_classes[entry["code_dir"]] = type(code)
            model = remote_classes[entry["code_dir"]].from_pretrained(entry["dir"], **load).eval()
        else:
            model = auto_class.from_pretrained(entry["dir"], trust_remote_code=True, **load).eval()
        result["classes"][key] = [type(model).__module__, type(model).__name__]
        result["config_classes"][key] = [type(model.config).__module__, type(model.config).__name__]
        with torch.no_grad():
            out = model(**model_inputs)
        if getattr(out, "start_logits", None) is not None:  # a span head: (batch, seq_len, 2)
            first = torch.stack([out.start_logits, out.end_logits], dim=-1)
        else:
            first = out.logits if getattr(out, "logits", None) is not None else out.last_hidden_state
        outputs[key] = first.contiguous()
        if entry.get("resave"):  # a remote-code model saved again (flat files copied by transformers) reloads
            model.save_pretrained(entry["resave"])
            again = auto_class.from_pretrained(entry["resave"], trust_remote_code=True, attn_implementation="eager")
            with torch.no_grad():
                outputs["resaved"] = again.eval()(**model_inputs).logits
            result["resaved_auto_map"] = json.load(open(entry["resave"] + "/config.json"))["auto_map"]
        if entry.get("generate"):
            kwargs = dict(
                input_ids=inputs["gen_input_ids"],
                attention_mask=inputs["gen_attention_mask"],
                max_new_tokens=8,
                min_new_tokens=8,
                do_sample=False,
            )
            with torch.no_grad():
                outputs["generate_cache"] = model.generate(**kwargs, use_cache=True).contiguous()
                outputs["generate_no_cache"] = model.generate(**kwargs, use_cache=False).contiguous()


    for entry in job["models"]:
        if not job.get("keep_going"):
            run(entry)
            continue
        try:
            run(entry)
        except Exception:
            result["errors"][entry.get("key", entry["auto"])] = traceback.format_exc()[-3000:]
    if job.get("tokenizer_dir"):
        # AutoTokenizer reads config.json (and its auto_map) too: without trust_remote_code it would prompt.
        tokenizer = transformers.AutoTokenizer.from_pretrained(job["tokenizer_dir"], trust_remote_code=True)
        result["tokenizer_ids"] = tokenizer(job["text"])["input_ids"]
    save_file(outputs, job["outputs"])
    result["hfzoo_modules_loaded"] = sorted(m for m in sys.modules if m == "hfzoo" or m.startswith("hfzoo."))
    print("RESULT " + json.dumps(result))
    """
)


def run_remote_code(python: Path, job: dict, workdir: Path, timeout: int = 300) -> dict:
    """Run `CLEAN_ENV_SCRIPT` on `job` in the clean interpreter (`clean_env.run_clean`).

    Returns:
        The script's JSON result (`hfzoo`, `hfzoo_modules_loaded`, `classes`, `config_classes`, `errors`, ...).
    """
    return clean_env.run_clean(python, CLEAN_ENV_SCRIPT, job, workdir, timeout=timeout)
