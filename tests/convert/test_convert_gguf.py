"""GGUF export for llama.cpp: metadata, tensors (names, shapes, types, the Q/K row permutation), the tokenizer,
refusals and the CLI, read back with llama.cpp's own `gguf.GGUFReader`."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from hfzoo import HfzooDecoderForCausalLM, HfzooDecoderForSequenceClassification
from hfzoo.convert import check_gguf_config, gguf_permute_qk, gguf_unpermute_qk, hfzoo_to_llama, write_gguf
from hfzoo.convert.cli import main
from hfzoo.models.presets import build_config
from hfzoo.tokenization import train_bpe_tokenizer

gguf = pytest.importorskip("gguf")

TEXT = [
    "The quick brown fox jumps over the lazy dog. It's 12 o'clock, and we've 345 apples!",
    "Byte-level BPE keeps every byte: café, naïve, 東京, emoji 🚀, tabs\tand\nnewlines.",
] * 20


@pytest.fixture(scope="module")
def tokenizer():
    return train_bpe_tokenizer([TEXT], vocab_size=300, min_frequency=1)


def random_model(tokenizer, preset="llama-tiny", **overrides):
    torch.manual_seed(0)
    fields = dict(vocab_size=len(tokenizer) + 5, pad_token_id=tokenizer.pad_token_id,
                  bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)  # fmt: skip
    config = build_config(preset, **{**fields, **overrides})
    model = HfzooDecoderForCausalLM(config).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(0.0, 0.3)
    return model


def field(reader, key):
    """A metadata value: a scalar, a string, or a list of either."""
    f = reader.fields[key]
    values = [f.parts[i] for i in f.data]
    if f.types[0] == gguf.GGUFValueType.STRING or (len(f.types) > 1 and f.types[1] == gguf.GGUFValueType.STRING):
        values = [bytes(v).decode("utf-8") for v in values]
    else:
        values = [v.item() for v in values]
    return values if f.types[0] == gguf.GGUFValueType.ARRAY else values[0]


def test_permutation_is_llama_cpps_and_inverts():
    heads, head_dim = 2, 8
    rows = torch.arange(heads * head_dim)
    permuted = gguf_permute_qk(rows, heads)
    # per head: rows (0, 4), (1, 5), ... ("rotate half" pairs) become neighbours (GGML's interleaved pairs)
    assert permuted.tolist() == [0, 4, 1, 5, 2, 6, 3, 7, 8, 12, 9, 13, 10, 14, 11, 15]
    weight = torch.randn(heads * head_dim, 3)
    assert torch.equal(gguf_unpermute_qk(gguf_permute_qk(weight, heads), heads), weight)


@pytest.mark.parametrize("preset, arch", [("llama-tiny", "llama"), ("qwen3-tiny", "qwen3")])
def test_f32_export_reads_back_with_llama_cpps_reader(tmp_path, tokenizer, preset, arch):
    model = random_model(tokenizer, preset)
    c = model.config
    path = write_gguf(model, tokenizer, tmp_path / "model.gguf", outtype="f32")
    reader = gguf.GGUFReader(path)
    expected = {
        "general.architecture": arch,
        "general.file_type": int(gguf.LlamaFileType.ALL_F32),
        f"{arch}.context_length": c.max_position_embeddings,
        f"{arch}.embedding_length": c.hidden_size,
        f"{arch}.block_count": c.num_hidden_layers,
        f"{arch}.feed_forward_length": c.intermediate_size,
        f"{arch}.attention.head_count": c.num_attention_heads,
        f"{arch}.attention.head_count_kv": c.num_key_value_heads,
        f"{arch}.attention.key_length": c.head_dim,
        f"{arch}.rope.dimension_count": c.head_dim,
        f"{arch}.vocab_size": c.vocab_size,
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "gpt-2",
        "tokenizer.ggml.bos_token_id": tokenizer.bos_token_id,
        "tokenizer.ggml.eos_token_id": tokenizer.eos_token_id,
        "tokenizer.ggml.padding_token_id": tokenizer.pad_token_id,
        "tokenizer.ggml.add_bos_token": True,  # hfzoo's decoder tokenizer prepends <|endoftext|>
        "tokenizer.ggml.add_eos_token": False,
    }
    assert {key: field(reader, key) for key in expected} == expected
    assert field(reader, f"{arch}.rope.freq_base") == pytest.approx(c.rope_theta)
    assert field(reader, f"{arch}.attention.layer_norm_rms_epsilon") == pytest.approx(c.rms_norm_eps)

    # the tokenizer: every token at its id, unused ids padded, the merges in order, special tokens as control
    vocab = tokenizer.get_vocab()
    tokens = field(reader, "tokenizer.ggml.tokens")
    assert len(tokens) == c.vocab_size and all(tokens[i] == t for t, i in vocab.items())
    types = field(reader, "tokenizer.ggml.token_type")
    assert types[tokenizer.bos_token_id] == gguf.TokenType.CONTROL and types[-1] == gguf.TokenType.UNUSED
    assert types[vocab["a"]] == gguf.TokenType.NORMAL
    stored = json.loads(tokenizer.backend_tokenizer.to_str())["model"]["merges"]
    assert field(reader, "tokenizer.ggml.merges") == [m if isinstance(m, str) else " ".join(m) for m in stored]

    # every tensor under llama.cpp's name, f32, values exact; q/k rows permuted for llama only
    native = hfzoo_to_llama(model).state_dict()
    tensors = {t.name: t for t in reader.tensors}
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH[arch.upper()], c.num_hidden_layers)
    expected_names = set()
    for key, value in native.items():
        if key == "lm_head.weight" and c.tie_word_embeddings:
            continue
        stem, suffix = key.rsplit(".", 1)
        name = f"{names.get_name(stem)}.{suffix}"
        expected_names.add(name)
        t = tensors[name]
        assert t.tensor_type == gguf.GGMLQuantizationType.F32
        assert tuple(int(d) for d in t.shape) == tuple(reversed(value.shape))  # GGML lists dims innermost first
        data = torch.from_numpy(np.array(t.data)).reshape(value.shape)
        if arch == "llama" and stem.endswith(("q_proj", "k_proj")):
            heads = c.num_attention_heads if stem.endswith("q_proj") else c.num_key_value_heads
            assert not torch.equal(data, value)
            data = gguf_unpermute_qk(data, heads)
        assert torch.equal(data, value), name
    assert set(tensors) == expected_names
    assert ("output.weight" in tensors) == (not c.tie_word_embeddings)
    if arch == "qwen3":
        assert "blk.0.attn_q_norm.weight" in tensors


@pytest.mark.parametrize("outtype, matrix_type, file_type", [("f16", "F16", "MOSTLY_F16"), ("q8_0", "Q8_0", "MOSTLY_Q8_0")])  # fmt: skip
def test_f16_and_q8_0_keep_vectors_f32_and_values_close(tmp_path, tokenizer, outtype, matrix_type, file_type):
    model = random_model(tokenizer)
    path = write_gguf(model, tokenizer, tmp_path / "model.gguf", outtype=outtype)
    reader = gguf.GGUFReader(path)
    assert field(reader, "general.file_type") == int(gguf.LlamaFileType[file_type])
    tensors = {t.name: t for t in reader.tensors}
    assert tensors["output_norm.weight"].tensor_type == gguf.GGMLQuantizationType.F32
    down = tensors["blk.0.ffn_down.weight"]
    assert down.tensor_type == gguf.GGMLQuantizationType[matrix_type]
    values = gguf.quants.dequantize(down.data, down.tensor_type)
    expected = model.state_dict()["model.layers.0.mlp.down_proj.weight"].numpy()
    np.testing.assert_allclose(values.reshape(expected.shape), expected, atol=0.02)


def test_a_config_llama_cpp_cannot_run_is_refused_naming_every_field(tmp_path, tokenizer):
    model = random_model(tokenizer, token_mixer="sliding_window", attention_window=8, hidden_act="gelu")
    with pytest.raises(ValueError, match=r"token_mixer='sliding_window'.*hidden_act='gelu'"):
        write_gguf(model, tokenizer, tmp_path / "model.gguf")
    assert not (tmp_path / "model.gguf").exists()
    # fields no native class maps are named too, with the llama.cpp ones
    config = build_config("llama-tiny", vocab_size=300, norm_position="post", hidden_act="gelu")
    with pytest.raises(ValueError, match=r"norm_position='post'.*hidden_act='gelu'"):
        check_gguf_config(config)
    assert check_gguf_config(build_config("llama-tiny", vocab_size=300)) == "llama"


def test_a_tokenizer_llama_cpp_cannot_read_is_refused(tmp_path, tokenizer):
    from tokenizers import pre_tokenizers

    other = train_bpe_tokenizer([TEXT], vocab_size=300, min_frequency=1)
    other.backend_tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    with pytest.raises(ValueError, match=r"pre_tokenizer 'ByteLevel' \(add_prefix_space=True"):
        write_gguf(random_model(tokenizer), other, tmp_path / "model.gguf")
    with pytest.raises(ValueError, match=rf"token id {len(tokenizer) - 1} \(the model's vocab_size is 100\)"):
        write_gguf(random_model(tokenizer, vocab_size=100), tokenizer, tmp_path / "model.gguf")


def test_cli_exports_hfzoo_and_native_folders(tmp_path, tokenizer, capsys):
    model = random_model(tokenizer, tie_word_embeddings=True)
    source, native = tmp_path / "hfzoo", tmp_path / "native"
    for folder, saved in ((source, model), (native, hfzoo_to_llama(model))):  # an hfzoo and a LlamaForCausalLM folder
        saved.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
    files = {}
    for name, folder in (("hfzoo", source), ("native", native)):
        main(["--model_name_or_path", str(folder), "--output_dir", str(tmp_path / f"{name}-gguf"), "--to", "gguf",
              "--outtype", "f32"])  # fmt: skip
        files[name] = tmp_path / f"{name}-gguf" / "model-f32.gguf"
        assert str(files[name]) in capsys.readouterr().out
    readers = {name: gguf.GGUFReader(path) for name, path in files.items()}
    assert field(readers["native"], "general.architecture") == "llama"
    assert "output.weight" not in {t.name for t in readers["hfzoo"].tensors}  # tied: llama.cpp reuses token_embd
    assert [t.name for t in readers["hfzoo"].tensors] == [t.name for t in readers["native"].tensors]
    for a, b in zip(readers["hfzoo"].tensors, readers["native"].tensors):
        assert np.array_equal(a.data, b.data), a.name
    with pytest.raises(SystemExit):
        main(["--model_name_or_path", str(source), "--output_dir", str(tmp_path / "x"), "--outtype", "q8_0"])
    assert "--outtype q8_0 needs --to gguf" in capsys.readouterr().err
    bad = tmp_path / "bad"
    random_model(tokenizer, hidden_act="gelu").save_pretrained(bad)
    with pytest.raises(SystemExit, match=r"^error: .*hidden_act='gelu'"):
        main(["--model_name_or_path", str(bad), "--output_dir", str(tmp_path / "bad-gguf"), "--to", "gguf"])
    assert not (tmp_path / "bad-gguf").exists()
    # a classifier: loaded as the language model it would lose its head
    classifier = tmp_path / "classifier"
    HfzooDecoderForSequenceClassification(model.config).save_pretrained(classifier)
    tokenizer.save_pretrained(classifier)
    with pytest.raises(SystemExit, match=r"HfzooDecoderForSequenceClassification is a task head; a GGUF file holds a"):
        main(["--model_name_or_path", str(classifier), "--output_dir", str(tmp_path / "cls-gguf"), "--to", "gguf"])
    assert not (tmp_path / "cls-gguf").exists()
