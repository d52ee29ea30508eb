"""Shared test fixtures: where the real data lives, and small real-text samples."""

from __future__ import annotations

import itertools
import json
import lzma
import os
import sysconfig
from pathlib import Path

import pytest
import torch
from accelerate.state import AcceleratorState, GradientState
from helpers import clean_env
from helpers.paths import shared_data_dir

from hfzoo.data.loading import clean_text
from hfzoo.study.parallel import cpu_cores
from hfzoo.tokenization import train_bpe_tokenizer


def _worker_threads() -> int | None:
    """CPU threads per pytest-xdist worker: the cores divided among the workers (None outside xdist).

    torch's default of one thread per core in every worker puts `workers x cores` threads on the cores; their
    parallel regions then wait on threads that are not running (the whole suite on 2 cores: 2,169 s that way,
    1,515 s with one thread per worker). The processes a test starts inherit `OMP_NUM_THREADS`, so that
    in-process runs and the child processes they are compared with bit for bit use the same number of threads.
    """
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if not workers or "OMP_NUM_THREADS" in os.environ:  # not a worker, or the caller chose
        return None
    return max(1, cpu_cores() // int(workers))


WORKER_THREADS = _worker_threads()


def _use_worker_threads() -> None:
    if WORKER_THREADS is not None:
        os.environ["OMP_NUM_THREADS"] = str(WORKER_THREADS)
        if torch.get_num_threads() != WORKER_THREADS:
            torch.set_num_threads(WORKER_THREADS)


def pytest_configure(config: pytest.Config) -> None:
    """In a pytest-xdist worker: `WORKER_THREADS` torch threads, and `OMP_NUM_THREADS` for the processes it starts."""
    _use_worker_threads()


@pytest.fixture(autouse=True)
def _worker_thread_count():
    """After each test, the worker's thread count again (a test or a job it runs in-process may change it), so that
    the next test and the module fixtures built before it start with it."""
    yield
    _use_worker_threads()


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    """Run the test files holding `slow` tests first, then the others, each group in collection order.

    `scripts/test.sh` runs the files on every core (pytest-xdist, `--dist loadfile`: a file runs whole on one
    worker; `--no-loadscope-reorder`: in this order, not by number of tests): the long files start first, and the
    many short ones fill the workers at the end.
    """
    slow = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow)  # a stable sort keeps each file's order


@pytest.fixture(scope="session")
def data_dir() -> Path:
    path = shared_data_dir()
    if not (path / "gutenberg").is_dir():
        pytest.skip(f"real data not found at {path} (set HFZOO_DATA_DIR)")
    return path


@pytest.fixture(scope="session")
def gutenberg_shard(data_dir: Path) -> Path:
    return data_dir / "gutenberg" / "pg_top100_en.00.jsonl.xz"


@pytest.fixture(scope="session")
def gutenberg_books(gutenberg_shard: Path) -> list[dict]:
    """The first 4 books of shard 00 (raw JSON rows, boilerplate and CRLF included)."""
    with lzma.open(gutenberg_shard, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in itertools.islice(f, 4)]


@pytest.fixture(scope="session")
def small_jsonl_xz(tmp_path_factory: pytest.TempPathFactory, gutenberg_books: list[dict]) -> Path:
    """A 4-book JSON-lines xz shard in the Gutenberg layout (real text), for fast end-to-end tests."""
    path = tmp_path_factory.mktemp("data") / "books.jsonl.xz"
    with lzma.open(path, "wt", encoding="utf-8") as f:
        for row in gutenberg_books:
            f.write(json.dumps(row) + "\n")
    return path


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory, gutenberg_books):
    """A 512-token byte-level BPE tokenizer (decoder family) of the 4 books, one per test module."""
    path = tmp_path_factory.mktemp("tokenizer")
    tokenizer = train_bpe_tokenizer([[clean_text(b["text"]) for b in gutenberg_books]], vocab_size=512)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def family_tokenizers(tmp_path_factory, gutenberg_books):
    """512-token tokenizers of the 4 books for the encoder and encoder-decoder families (their special tokens)."""
    texts = [clean_text(b["text"]) for b in gutenberg_books]
    paths = {}
    for family in ("encoder", "encoder-decoder"):
        path = tmp_path_factory.mktemp(family)
        train_bpe_tokenizer([texts], vocab_size=512, model_family=family, num_extra_ids=40).save_pretrained(path)
        paths[family] = path
    return paths


#: A site-packages folder holding another transformers release than this venv's (CI: the lowest accepted one), for
#: loading remote-code exports made here with that release.
OTHER_RELEASE_ENV = "HFZOO_OTHER_RELEASE_SITE_PACKAGES"


@pytest.fixture(scope="session")
def other_release_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A clean interpreter that sees the packages of `$HFZOO_OTHER_RELEASE_SITE_PACKAGES` (not hfzoo)."""
    site_packages = os.environ.get(OTHER_RELEASE_ENV)
    if not site_packages:
        pytest.skip(f"set {OTHER_RELEASE_ENV} to another venv's site-packages (CI: the lowest accepted versions)")
    if not Path(site_packages, "transformers").is_dir():
        raise FileNotFoundError(f"{OTHER_RELEASE_ENV}={site_packages} holds no transformers package")
    return clean_env.make_clean_venv(tmp_path_factory.mktemp("other_release_venv"), [Path(site_packages)])


@pytest.fixture(scope="session")
def clean_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A clean interpreter that sees this venv's packages but not hfzoo (one per test session, `remote_code.py`)."""
    site_packages = Path(sysconfig.get_paths()["purelib"])
    return clean_env.make_clean_venv(tmp_path_factory.mktemp("clean_venv"), [site_packages])


@pytest.fixture(autouse=True)
def _fresh_accelerate_state():
    """Reset accelerate's process-wide state after each test.

    Recipes run in-process (`main(argv)`) and Trainer create it with their own settings (mixed precision,
    CPU); a later test in the same process must be able to create its own, as a fresh process would.
    """
    yield
    AcceleratorState._reset_state(True)
    GradientState._reset_state()
