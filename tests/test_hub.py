"""`hfzoo.hub`: model cards, the upload file selection, and `push_to_hub` (HfApi calls recorded, no network)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from huggingface_hub import HfApi, ModelCard
from huggingface_hub.utils import DEFAULT_IGNORE_PATTERNS, filter_repo_objects

import hfzoo
from hfzoo import hub
from hfzoo.export import export_for_remote_code
from hfzoo.tokenization import train_bpe_tokenizer

TINY = dict(
    vocab_size=100,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=48,
    max_position_embeddings=64,
    hidden_act="gelu_new",
    norm_type="rms_norm",
    position_embedding_type="learned",
    tie_word_embeddings=False,
)
RESULTS = {
    "eval_loss": 4.25,
    "perplexity": 70.105,
    "unigram_perplexity": 512.5,
    "perplexity_ratio_to_unigram": 0.1368,
    "train_loss": 4.5,
    "train_steps": 10,
    "train_tokens_seen": 20480,
    "block_size": 64,
}
ARGS = {
    "objective": "clm",
    "train_file": ["/data/gutenberg/pg_top100_en.00.jsonl.xz"],
    "validation_split_percentage": 5,
    "learning_rate": 5e-4,
    "per_device_train_batch_size": 8,
    "hub_token": "hf_this_must_not_leak",
    "output_dir": "outputs/tiny",
}
TEXT = "It was the best of times, it was the worst of times. " * 30


def tiny_model():
    torch.manual_seed(0)
    return hfzoo.HfzooDecoderForCausalLM(hfzoo.HfzooDecoderConfig(**TINY))


@pytest.fixture
def model_folder(tmp_path) -> tuple[Path, list[str]]:
    """A saved model + tokenizer + results, then the things that must not be uploaded."""
    folder = tmp_path / "tiny-run"
    tiny_model().save_pretrained(folder)
    train_bpe_tokenizer([TEXT], vocab_size=280, min_frequency=1).save_pretrained(folder)
    (folder / "all_results.json").write_text(json.dumps(RESULTS))
    expected = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
    # Must not be uploaded: a resumable checkpoint, tracker logs, temporary files.
    (folder / "checkpoints" / "step_10").mkdir(parents=True)
    (folder / "checkpoints" / "step_10" / "model.safetensors").write_bytes(b"x")
    (folder / "checkpoints" / "step_10" / "training_state.json").write_text("{}")
    (folder / "checkpoints" / "step_20.tmp").mkdir()
    (folder / "checkpoints" / "step_20.tmp" / "optimizer.bin").write_bytes(b"x")
    (folder / "pretrain").mkdir()
    (folder / "pretrain" / "events.out.tfevents.1.host").write_bytes(b"x")
    (folder / "x.tmp").write_text("partial")
    (folder / "all_results.json.tmp").write_text("{}")
    return folder, expected


def test_files_to_upload_excludes_checkpoints_logs_and_tmp(model_folder):
    folder, expected = model_folder
    assert {"config.json", "model.safetensors", "tokenizer.json", "all_results.json"} <= set(expected)
    assert hub.files_to_upload(folder) == expected
    with pytest.raises(NotADirectoryError):
        hub.files_to_upload(folder / "config.json")


def test_checkpoint_dir_matches_the_recipe():
    from hfzoo.pretraining import loop as pretraining
    from hfzoo.training import checkpointing

    assert hub.CHECKPOINT_DIR == checkpointing.CHECKPOINT_DIR
    assert pretraining.push_to_hub is hub.push_to_hub


class RecordedCalls(list):
    """The hub calls of a test, in order, and the visibility of the repositories (`private`: repo id -> bool)."""

    def __init__(self):
        super().__init__()
        self.private: dict[str, bool] = {}


@pytest.fixture
def recorded_hub(monkeypatch):
    """Replace HfApi.create_repo / upload_folder / model_info by recorders; the repo lands in the namespace `someone`.

    `calls.private` maps each repository of this hub to its visibility (`create_repo` keeps an existing one's).
    """
    calls = RecordedCalls()

    def create_repo(self, repo_id, **kwargs):
        calls.append(("create_repo", repo_id, kwargs, self.token))
        repo_id = repo_id if "/" in repo_id else f"someone/{repo_id}"
        calls.private.setdefault(repo_id, bool(kwargs.get("private")))
        return SimpleNamespace(repo_id=repo_id)

    monkeypatch.setattr(
        HfApi, "model_info", lambda self, repo_id, **kw: SimpleNamespace(private=calls.private[repo_id])
    )

    def upload_folder(self, **kwargs):
        calls.append(("upload_folder", kwargs["repo_id"], kwargs, self.token))
        return SimpleNamespace(
            repo_id=kwargs["repo_id"], commit_url=f"https://huggingface.co/{kwargs['repo_id']}/commit/0123abc"
        )

    monkeypatch.setattr(HfApi, "create_repo", create_repo)
    monkeypatch.setattr(HfApi, "upload_folder", upload_folder)
    return calls


def uploaded_files(folder: Path, kwargs: dict) -> list[str]:
    """The files `HfApi.upload_folder` selects with these arguments (its own logic: patterns + defaults)."""
    assert kwargs.get("allow_patterns") is None and kwargs.get("path_in_repo") in (None, "")
    files = sorted(p.relative_to(folder).as_posix() for p in Path(kwargs["folder_path"]).rglob("*") if p.is_file())
    return list(filter_repo_objects(files, ignore_patterns=list(kwargs["ignore_patterns"]) + DEFAULT_IGNORE_PATTERNS))


def test_push_to_hub_sends_the_model_files_and_a_card(model_folder, recorded_hub):
    folder, expected = model_folder
    url = hub.push_to_hub(folder, "tiny-model", token="hf_fake", private=True, training_args=ARGS)

    assert url == "https://huggingface.co/someone/tiny-model/commit/0123abc"
    assert [c[0] for c in recorded_hub] == ["create_repo", "upload_folder"]
    _, repo_id, kwargs, token = recorded_hub[0]
    assert (repo_id, kwargs["exist_ok"], kwargs["private"], token) == ("tiny-model", True, True, "hf_fake")
    _, repo_id, kwargs, token = recorded_hub[1]
    assert repo_id == "someone/tiny-model" and token == "hf_fake"
    assert Path(kwargs["folder_path"]) == folder
    assert uploaded_files(folder, kwargs) == sorted([*expected, "README.md"])

    card = ModelCard.load(folder / "README.md")
    assert card.data.pipeline_tag == "text-generation"
    assert card.data.tags == ["hfzoo", "hfzoo_decoder", "causal-lm"]
    assert 'from_pretrained("tiny-model")' in card.text
    assert "hf_this_must_not_leak" not in card.content


def test_a_private_upload_to_an_existing_public_repository_is_refused(model_folder, recorded_hub):
    """create_repo keeps an existing repository's visibility: private=True must not publish the model there."""
    folder, _ = model_folder
    recorded_hub.private["someone/public-model"] = False
    with pytest.raises(ValueError, match="^a private repository asked for, but the hub repository "
                                         "someone/public-model exists and is public"):  # fmt: skip
        hub.push_to_hub(folder, "someone/public-model", private=True)
    assert [c[0] for c in recorded_hub] == ["create_repo"]  # no upload
    hub.push_to_hub(folder, "someone/public-model")  # without private=True: uploaded as before
    recorded_hub.private["someone/private-model"] = True
    hub.push_to_hub(folder, "someone/private-model", private=True)
    assert [c[1] for c in recorded_hub if c[0] == "upload_folder"] == ["someone/public-model", "someone/private-model"]


def hub_args(**kw) -> argparse.Namespace:
    """The recipes' hub arguments (`--push_to_hub --hub_model_id me/tiny`), overridden by `kw`."""
    values = {"push_to_hub": True, "hub_model_id": "me/tiny", "hub_token": None, "hub_private_repo": None}
    return argparse.Namespace(output_dir="out", **{**values, **kw})


def test_check_hub_repository_creates_the_repository_before_training(recorded_hub):
    from hfzoo.training.arguments import check_hub_repository

    assert check_hub_repository(hub_args(push_to_hub=False, hub_model_id=None)) is None
    assert recorded_hub == []  # without --push_to_hub the hub is not asked
    assert check_hub_repository(hub_args(hub_model_id="tiny", hub_token="hf_fake", hub_private_repo=True)) == (
        "someone/tiny"
    )
    assert recorded_hub == [
        ("create_repo", "tiny", {"private": True, "exist_ok": True, "repo_type": "model"}, "hf_fake")
    ]
    recorded_hub.private["someone/public-model"] = False
    with pytest.raises(ValueError, match="^--hub_private_repo: a private repository asked for, but the hub repository "
                                         "someone/public-model exists and is public"):  # fmt: skip
        check_hub_repository(hub_args(hub_model_id="someone/public-model", hub_private_repo=True))


def test_check_hub_repository_names_the_hubs_answer_without_the_token(monkeypatch):
    """Offline (the hub client's own refusal), or a refused token: one line naming the repository, token hidden."""
    import huggingface_hub
    from huggingface_hub.errors import HfHubHTTPError, HFValidationError
    from huggingface_hub.utils import httpx

    from hfzoo.training.arguments import check_hub_repository

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)  # the real client, refusing
    with pytest.raises(ValueError) as refused:
        check_hub_repository(hub_args())
    assert str(refused.value).startswith(
        "--push_to_hub: cannot create the hub repository me/tiny (OfflineModeIsEnabled: Cannot reach "
    )
    assert str(refused.value).endswith(
        "or train without --push_to_hub and upload the output folder later (`hf upload`)"
    )

    def unauthorized(self, repo_id, **kwargs):
        response = httpx.Response(401, request=httpx.Request("POST", "https://huggingface.co/api/repos/create"))
        raise HfHubHTTPError(f"401 Client Error: Unauthorized (token {self.token})\nmore lines", response=response)

    monkeypatch.setattr(HfApi, "create_repo", unauthorized)
    with pytest.raises(ValueError) as refused:
        check_hub_repository(hub_args(hub_token="hf_secret_xyz"))
    assert "(HfHubHTTPError: 401 Client Error: Unauthorized (token ***)); check the network" in str(refused.value)
    assert "hf_secret_xyz" not in str(refused.value) and "more lines" not in str(refused.value)

    def invalid(self, repo_id, **kwargs):  # the hub client's own name check (a ValueError, not a public repository)
        raise HFValidationError(f"Repo id must use alphanumeric chars: '{repo_id}'.")

    monkeypatch.setattr(HfApi, "create_repo", invalid)
    with pytest.raises(
        ValueError, match=r"^--push_to_hub: cannot create the hub repository me/tiny \(HFValidationError"
    ):
        check_hub_repository(hub_args(hub_private_repo=True))


def test_push_to_hub_keeps_an_existing_readme(model_folder, recorded_hub):
    folder, _ = model_folder
    (folder / "README.md").write_text("---\nlicense: mit\n---\n# Mine\n")
    hub.push_to_hub(folder, "someone/else")
    assert (folder / "README.md").read_text() == "---\nlicense: mit\n---\n# Mine\n"
    assert recorded_hub[0][1] == "someone/else" and recorded_hub[0][2]["private"] is None
    assert "README.md" in uploaded_files(folder, recorded_hub[1][2])


def test_model_card_metadata_architecture_and_metrics(model_folder):
    folder, _ = model_folder
    card = hub.build_model_card(folder, training_args=argparse.Namespace(**ARGS))  # results from all_results.json
    assert card.data.library_name == "transformers"
    assert card.data.pipeline_tag == "text-generation"
    assert card.data.tags == ["hfzoo", "hfzoo_decoder", "causal-lm"]
    assert card.data.metrics == ["perplexity"]
    text = card.text
    n_params = sum(p.numel() for p in tiny_model().parameters())
    for field, value in [
        ("hidden_size", "32"),
        ("num_hidden_layers", "2"),
        ("num_attention_heads", "4"),
        ("head_dim", "8"),
        ("intermediate_size", "48"),
        ("hidden_act", "gelu_new"),
        ("position_embedding_type", "learned"),
        ("norm_type", "rms_norm"),
        ("norm_position", "pre"),
        ("vocab_size", "100"),
        ("tie_word_embeddings", "False"),
    ]:
        assert f"| `{field}` | {value} |" in text, field
    assert "num_decoder_layers" not in text
    assert f"| parameters | {n_params:,} |" in text and "HfzooDecoderForCausalLM" in text
    assert "| `eval_loss` | 4.2500 |" in text and "| `perplexity` | 70.1050 |" in text
    assert "| `unigram_perplexity` | 512.5000 |" in text
    assert "optimizer steps: 10" in text and "tokens seen: 20,480" in text
    assert "`pg_top100_en.00.jsonl.xz`" in text
    assert "import hfzoo" in text and "trust_remote_code" not in text.split("## How to use")[1].split("```")[1]
    assert "hf_this_must_not_leak" not in card.content and "hub_token" not in card.content
    assert "```json" in text and '"learning_rate": 0.0005' in text
    assert card.data.base_model is None and "continued from" not in text  # trained from newly initialized weights
    # the card round-trips through README.md
    card.save(folder / "README.md")
    assert ModelCard.load(folder / "README.md").data.to_dict() == card.data.to_dict()


def test_a_continued_pretraining_card_names_its_base_model_as_metadata_only_when_it_is_a_hub_id(model_folder):
    """The hub accepts only model ids as `base_model`: an upload whose card names a local path is refused."""
    folder, _ = model_folder
    card = hub.build_model_card(folder, training_args={**ARGS, "model_name_or_path": "HuggingFaceTB/SmolLM2-135M"})
    assert card.data.base_model == "HuggingFaceTB/SmolLM2-135M"
    assert "- continued from: `HuggingFaceTB/SmolLM2-135M`" in card.text
    local = folder.parent / "outputs" / "smollm2-hfzoo"
    local.mkdir(parents=True)
    card = hub.build_model_card(folder, training_args={**ARGS, "model_name_or_path": str(local)})
    assert card.data.base_model is None and f"- continued from: `{local}`" in card.text
    assert "base_model" not in card.content.split("---")[1]
    for name, expected in [(None, None), ("gpt2", "gpt2"), ("someone/model", "someone/model"), (str(local), None),
                           ("./outputs/run", None), ("outputs/run/final", None), ("/abs/run", None)]:  # fmt: skip
        assert hub.hub_base_model(name) == expected, name


def test_model_card_of_an_exported_folder_says_trust_remote_code(tmp_path):
    export_for_remote_code(tiny_model(), tmp_path)
    text = hub.build_model_card(tmp_path, model_name="me/tiny").text
    assert 'AutoModelForCausalLM.from_pretrained("me/tiny", trust_remote_code=True)' in text
    assert "import hfzoo" not in text.split("## How to use")[1].split("```")[1]


def test_model_card_of_a_sentence_transformers_folder_is_that_librarys(tmp_path):
    torch.manual_seed(0)
    hfzoo.HfzooEncoderModel(hfzoo.HfzooEncoderConfig(**TINY)).save_pretrained(tmp_path / "model")
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]  # fmt: skip
    (tmp_path / "model" / "modules.json").write_text(json.dumps(modules))
    card = hub.build_model_card(tmp_path / "model", model_name="me/embedder")
    assert card.data.library_name == "sentence-transformers" and card.data.pipeline_tag == "sentence-similarity"
    assert card.data.tags == ["hfzoo", "hfzoo_encoder", "sentence-transformers"]
    usage = card.text.split("## How to use")[1].split("```")[1]
    assert "import hfzoo" in usage and 'SentenceTransformer("me/embedder")' in usage
    export_for_remote_code(str(tmp_path / "model"), tmp_path / "remote")  # the modules go with the export
    usage = hub.build_model_card(tmp_path / "remote", model_name="me/embedder").text.split("## How to use")[1]
    assert 'SentenceTransformer("me/embedder", trust_remote_code=True)' in usage.split("```")[1]
    assert "import hfzoo" not in usage.split("```")[1]


@pytest.mark.parametrize(
    "config_class, pipeline_tag, model_class",
    [
        (hfzoo.HfzooDecoderConfig, "text-generation", hfzoo.HfzooDecoderForCausalLM),
        (hfzoo.HfzooEncoderConfig, "fill-mask", hfzoo.HfzooEncoderForMaskedLM),
        (hfzoo.HfzooEncoderDecoderConfig, "text2text-generation", hfzoo.HfzooEncoderDecoderForConditionalGeneration),
    ],
)
def test_model_card_per_family(config_class, pipeline_tag, model_class):
    config = config_class(**{**TINY, "num_hidden_layers": 3})
    card = hub.build_model_card(config, {"eval_loss": 1.0}, {"objective": "mlm", "dataset_name": "wikitext"})
    assert card.data.pipeline_tag == pipeline_tag
    assert card.data.tags == ["hfzoo", config.model_type, "masked-lm"]
    assert card.data.datasets == ["wikitext"] and card.data.metrics is None
    assert model_class.__name__ in card.text and "dataset: `wikitext`" in card.text
    assert f"{sum(p.numel() for p in model_class(config).parameters()):,} parameters" in card.text
    assert ("| `num_decoder_layers` | 3 |" in card.text) == (config_class is hfzoo.HfzooEncoderDecoderConfig)


@pytest.mark.parametrize(
    "config_class, model_class, pipeline_tag",
    [
        (hfzoo.HfzooEncoderConfig, hfzoo.HfzooEncoderForSequenceClassification, "text-classification"),
        (hfzoo.HfzooEncoderConfig, hfzoo.HfzooEncoderForTokenClassification, "token-classification"),
        (hfzoo.HfzooEncoderConfig, hfzoo.HfzooEncoderForQuestionAnswering, "question-answering"),
        (hfzoo.HfzooDecoderConfig, hfzoo.HfzooDecoderForSequenceClassification, "text-classification"),
        (hfzoo.HfzooDecoderConfig, hfzoo.HfzooDecoderForTokenClassification, "token-classification"),
        (hfzoo.HfzooDecoderConfig, hfzoo.HfzooDecoderForQuestionAnswering, "question-answering"),
        (hfzoo.HfzooEncoderDecoderConfig, hfzoo.HfzooEncoderDecoderForQuestionAnswering, "question-answering"),
        (hfzoo.HfzooEncoderDecoderConfig, hfzoo.HfzooEncoderDecoderForTokenClassification, "token-classification"),
        (hfzoo.HfzooEncoderDecoderConfig, hfzoo.HfzooEncoderDecoderEncoderModel, "feature-extraction"),
        (hfzoo.HfzooEncoderConfig, hfzoo.HfzooEncoderModel, "feature-extraction"),
        (hfzoo.HfzooDecoderConfig, hfzoo.HfzooDecoderModel, "feature-extraction"),
    ],
)
def test_model_card_of_a_task_head_has_its_pipeline_tag(tmp_path, config_class, model_class, pipeline_tag):
    """A finetuned head saved with `save_pretrained` (its class in `architectures`) is tagged with its task."""
    torch.manual_seed(0)
    model_class(config_class(**TINY)).save_pretrained(tmp_path)
    card = hub.build_model_card(tmp_path, model_name="me/finetuned")
    assert card.data.pipeline_tag == pipeline_tag
    assert model_class.__name__ in card.text
    first_line = card.text.split("\n# me/finetuned\n\n")[1].split("\n")[0]
    if pipeline_tag == "feature-extraction":  # the bare stack: no head
        assert f"without a head (hidden states): `{model_class.__name__}`" in first_line
        assert f"{sum(p.numel() for p in model_class(config_class(**TINY)).parameters()):,} parameters" in card.text
    else:
        assert f"Transformer with a {pipeline_tag.replace('-', ' ')} head: `{model_class.__name__}`" in first_line


def test_model_card_errors(tmp_path):
    with pytest.raises(OSError, match="no config.json"):
        hub.build_model_card(tmp_path)
    from transformers import GPT2Config

    with pytest.raises(ValueError, match="not an hfzoo config"):
        hub.build_model_card(GPT2Config())


def test_a_checkpoint_name_that_loads_nothing_is_refused_saying_whether_it_is_a_local_folder(tmp_path, monkeypatch):
    """A mistyped folder of the hub's `namespace/name` form is tried as a hub id: the message says it is no folder."""
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)  # the hub's answer without a network wait
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError) as err:
        hub.load_checkpoint_config("outputs/run", "--model_name_or_path")
    assert str(err.value).startswith("--model_name_or_path outputs/run: not a local folder; as a hub id: ")
    (tmp_path / "outputs" / "run").mkdir(parents=True)  # a folder, without a config
    with pytest.raises(ValueError) as err:
        hub.load_checkpoint_config("outputs/run", "--model_name_or_path")
    assert str(err.value).startswith("--model_name_or_path outputs/run: ")
    assert "not a local folder" not in str(err.value)
    for name, expected in [("./outputs/other", "no such folder"), ("/no/such/run", "no such folder"),
                           ("outputs/run/config.json", "no such folder")]:  # fmt: skip
        with pytest.raises(ValueError, match=f"^--tokenizer_name {name}: {expected}$"):
            hub.check_model_path(name, "--tokenizer_name")
    (tmp_path / "weights.bin").write_bytes(b"")
    with pytest.raises(ValueError, match="^--model_name_or_path weights.bin: is a file, not a folder$"):
        hub.check_model_path("weights.bin")
    hub.check_model_path("outputs/run")  # a folder
    hub.check_model_path("someone/model")  # a hub id: left to the hub


def test_save_final_model_writes_the_card_and_pushes(tmp_path, recorded_hub):
    """The recipe's `save_final_model`: README.md with results + arguments, then `hfzoo.hub.push_to_hub`."""
    from accelerate import Accelerator

    from hfzoo.pretraining import loop as pretraining

    tokenizer = train_bpe_tokenizer([TEXT], vocab_size=280, min_frequency=1)
    args = argparse.Namespace(
        **{**ARGS, "output_dir": str(tmp_path / "out")},
        sample_prompt=None,
        push_to_hub=True,
        hub_model_id="me/tiny",
        hub_private_repo=True,
    )
    run = SimpleNamespace(args=args, accelerator=Accelerator(cpu=True), model=tiny_model(), tokenizer=tokenizer)
    pretraining.save_final_model(run, dict(RESULTS), [])
    card = ModelCard.load(tmp_path / "out" / "README.md")
    assert card.data.tags == ["hfzoo", "hfzoo_decoder", "causal-lm"]
    assert "| `perplexity` | 70.1050 |" in card.text and 'from_pretrained("me/tiny")' in card.text
    assert "hf_this_must_not_leak" not in card.content
    assert [c[0] for c in recorded_hub] == ["create_repo", "upload_folder"]
    assert recorded_hub[0][1] == "me/tiny" and recorded_hub[0][3] == "hf_this_must_not_leak"
    assert recorded_hub[0][2]["private"] is True  # --hub_private_repo
    assert "README.md" in uploaded_files(tmp_path / "out", recorded_hub[1][2])
