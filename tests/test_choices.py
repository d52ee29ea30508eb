"""`hfzoo.choices`: an unknown name is refused with its closest known names, not the whole list."""

from __future__ import annotations

import pytest
from huggingface_hub.errors import StrictDataclassClassValidationError

from hfzoo import HfzooDecoderConfig
from hfzoo.choices import SHOWN_WHOLE, choice_hint, closest_matches
from hfzoo.models.modern import STUDY_ROWS, row_pretrain_args


def test_closest_matches_whole_names_and_misspelt_starts():
    assert closest_matches("swiglue", ["SwiGLU", "GeLU", "ReLU"]) == ["SwiGLU"]  # case-insensitive, own spelling
    assert closest_matches("Vanila", ["Vanilla Transformer", "Funnel Transformer"]) == ["Vanilla Transformer"]
    assert closest_matches("xyz", ["SwiGLU", "GeLU"]) == []


def test_a_short_list_is_shown_whole_a_long_one_by_its_closest_names():
    assert choice_hint("rmsnorm", ["layer_norm", "rms_norm"]) == (
        "choose one of ['layer_norm', 'rms_norm']; did you mean 'rms_norm'?"
    )
    assert choice_hint("zzz", ["a", "b"]) == "choose one of ['a', 'b']"
    names = ["alpha", "beta", *(f"row {i}" for i in range(SHOWN_WHOLE))]
    assert choice_hint("alpah", names, "X") == f"did you mean 'alpha'? ({SHOWN_WHOLE + 2} choices, listed in X)"
    assert choice_hint("other", names, "X") == f"none of the {SHOWN_WHOLE + 2} choices is close (listed in X)"


def test_an_unknown_study_row_names_the_closest_rows_in_one_short_line():
    with pytest.raises(ValueError) as err:
        row_pretrain_args("+ factorized & shared embedding")
    message = str(err.value)
    assert message.startswith("unknown row '+ factorized & shared embedding'; did you mean '+ Factorized & shared")
    assert len(message) < 300 and str(len(STUDY_ROWS)) in message and "\n" not in message


def test_an_unknown_config_choice_names_the_closest_value():
    with pytest.raises(
        StrictDataclassClassValidationError,
        match=r"norm_type='rmsnorm' is not supported; choose one of .*did you mean 'rms_norm'",
    ):
        HfzooDecoderConfig(norm_type="rmsnorm")


def test_an_invalid_flag_choice_names_the_closest_choice(capsys):
    from hfzoo.pretraining import parse_pretrain_args

    with pytest.raises(SystemExit):
        parse_pretrain_args(["--lr_scheduler_type", "cosin", "--output_dir", "out", "--train_file", "books.jsonl"])
    message = capsys.readouterr().err.strip()
    assert message.startswith("hfzoo-pretrain: error: argument --lr_scheduler_type: invalid choice: 'cosin'; ")
    assert message.endswith("did you mean 'cosine'?") and "\n" not in message
