"""Streamed pretraining data (`--streaming`): per-process shards of an `IterableDataset`, with a resumable position.

Documents are read lazily (`datasets` streaming), split between processes with
`datasets.distributed.split_dataset_by_node` (whole files per process when their number divides evenly,
else every `num_processes`-th document), then tokenized and packed on the fly
(`hfzoo.data.packing.pack_stream`: each block as soon as its documents are tokenized), so no two processes
train on the same block and nothing is materialized in memory or on disk. `StreamingTrainLoader` batches a
process's stream, read ahead of the training loop on a thread of its own, and is registered with accelerate's
checkpointing: a checkpoint stores every process's position in its stream after the last batch the loop took
(`PackedStream.state_dict`), and a resumed run continues with exactly the blocks the uninterrupted run would
have seen. Streams are read in order (no shuffle buffer, whose contents a checkpoint could
not restore).
"""

from __future__ import annotations

import copy
import queue
import threading
from collections.abc import Iterator
from typing import Any

import datasets
import torch
from accelerate import Accelerator
from accelerate.utils import gather_object, send_to_device
from datasets.distributed import split_dataset_by_node
from torch.utils.data import DataLoader

from ..data.packing import PackedStream, pack_stream


def stream_blocks(
    raw: datasets.IterableDatasetDict,
    tokenizer,
    text_column_name: str,
    block_size: int,
    with_labels: bool,
    *,
    clean: bool = True,
    max_train_samples: int | None = None,
    max_eval_samples: int | None = None,
    process_index: int = 0,
    num_processes: int = 1,
    sources: tuple[str, str] = ("the training data", "the validation data"),
) -> tuple[PackedStream, PackedStream]:
    """Pack the streamed `train` and `validation` splits into blocks; the training stream is this process's shard.

    Args:
        raw: streamed splits `train` and `validation` (`hfzoo.data.loading.load_raw_datasets(..., streaming=True)`).
        tokenizer: the tokenizer.
        text_column_name: the text column.
        block_size: tokens per packed block (the objective's raw block length).
        with_labels: store a `labels` copy of each block (causal LM).
        clean: apply `clean_text` before tokenizing.
        max_train_samples: keep at most this many training blocks (per process).
        max_eval_samples: keep at most this many validation blocks.
        process_index: this process's rank.
        num_processes: the world size.
        sources: what the two splits came from (`--train_file books.jsonl`), for the message of a record that cannot
            be parsed (a `hfzoo.data.loading.DataReadError` while the stream is read).

    Returns:
        `(train, validation)` `PackedStream`s of blocks; the validation stream is whole on every process.
    """
    train = split_dataset_by_node(raw["train"], rank=process_index, world_size=num_processes)
    # The training stream is read on `StreamingTrainLoader`'s thread while the validation stream is read on the
    # training thread: each has a tokenizer of its own (a fast tokenizer's settings are state shared by callers).
    train = pack_stream(train, copy.deepcopy(tokenizer), text_column_name, block_size, clean, with_labels,
                        max_train_samples, sources[0])  # fmt: skip
    validation = pack_stream(raw["validation"], tokenizer, text_column_name, block_size, clean, with_labels,
                             max_eval_samples, sources[1])  # fmt: skip
    return train, validation


#: How far the reading thread of `StreamingTrainLoader` may run ahead of the training loop, in tokens (about 1 s
#: of a GPU step at 500k tokens/s, and about 40 MiB of Python token lists with their labels copy).
PREFETCH_TOKENS = 2**19


class StreamingTrainLoader:
    """This process's batches of a streamed training split, read ahead on a thread, with a checkpointable position.

    Iterating gives one pass over the stream (an epoch): lists of `batch_size` examples (dicts of token-id
    lists, `PackedStream`'s blocks), which the training loop collates, as it does the map-style loader's
    batches (so a random collator draws from torch's global RNG on the training thread, in step order). The
    documents are read, tokenized and packed on a thread of their own, up to `prefetch_batches` batches ahead
    of the training loop: the tokenizer (Rust, without the GIL, on every core unless `TOKENIZERS_PARALLELISM`
    is false) works while the loop waits for the device, instead of stalling a step every `TOKENIZE_BATCH_SIZE`
    documents. The blocks and their order are those of reading the stream on the training thread.

    `state_dict` is the position after the last batch the loop took (not after the last one read ahead), so a
    checkpoint resumes with the batch that followed; it gathers every process's position (so it must be called
    on all processes, as `accelerator.save_state` does). `load_state_dict` restores this process's, and the next
    pass continues from there.

    Args:
        dataset: this process's stream of blocks.
        batch_size: blocks per batch.
        accelerator: gives the rank and the world size.
        min_batches: fewer batches in a pass is an error (a pass must make at least one optimizer step).
        prefetch_batches: batches read ahead at most (default: `PREFETCH_TOKENS` worth of blocks, at least 2).
    """

    def __init__(
        self,
        dataset: PackedStream,
        batch_size: int,
        accelerator: Accelerator,
        min_batches: int = 1,
        prefetch_batches: int | None = None,
    ) -> None:
        self.dataset = dataset
        # The loader's own generator: starting a pass draws its seed from it, not from torch's global RNG (which
        # the objectives' masking and dropout use), so a run resumed mid-pass draws what the uninterrupted one did.
        self.loader = DataLoader(dataset, batch_size=batch_size, collate_fn=list, generator=torch.Generator())
        self.accelerator = accelerator
        self.min_batches = min_batches
        self.prefetch_batches = prefetch_batches or max(2, PREFETCH_TOKENS // (batch_size * dataset.block_size))
        self._taken: dict[str, Any] | None = None  # the position after the last batch the loop took
        self._resumed = False  # the next pass continues a loaded position (which may be its end)

    def set_epoch(self, epoch: int) -> None:
        """Start pass `epoch` (the stream's epoch, part of its state)."""
        self.dataset.set_epoch(epoch)

    @property
    def epoch(self) -> int:
        """The current pass (restored with the position)."""
        return self.dataset.epoch

    def __iter__(self) -> Iterator[list[dict[str, Any]]]:
        """Yield the batches of one pass, read ahead on a thread (stopped when the pass ends or is left).

        Raises:
            ValueError: a pass from the stream's start yields fewer than `min_batches` batches (a pass resumed
                from a checkpoint may yield none: one saved after the pass's last batch).
            Exception: whatever reading the stream raised, on the training thread.
        """
        self._taken = self.dataset.state_dict()  # nothing read yet: where this pass starts
        resumed, self._resumed = self._resumed, False
        ahead: queue.Queue = queue.Queue(maxsize=self.prefetch_batches)
        stop = threading.Event()

        def put(item) -> bool:  # False once the pass is left
            while not stop.is_set():
                try:
                    ahead.put(item, timeout=0.1)
                    return True
                except queue.Full:
                    continue
            return False

        def read() -> None:
            try:
                for batch in self.loader:  # the stream's position after a batch is read with it
                    if not put((batch, self.dataset.state_dict())):
                        return
                put((None, self.dataset.state_dict()))  # the pass's end (its last documents read)
            except BaseException as error:  # raised again on the training thread
                put((error, None))

        reader = threading.Thread(target=read, name="hfzoo-stream-reader", daemon=True)
        reader.start()
        count = 0
        try:
            while True:
                batch, position = ahead.get()
                if isinstance(batch, BaseException):
                    raise batch
                self._taken = position
                if batch is None:
                    break
                count += 1
                yield batch
        finally:
            stop.set()
            reader.join()
        if count < self.min_batches and not resumed:
            raise ValueError(
                f"process {self.accelerator.process_index}'s share of the training stream yields {count} batch(es) "
                f"in a pass, fewer than the {self.min_batches} of one optimizer step; give more data"
            )

    def state_dict(self) -> dict[str, Any]:
        """Every process's stream position after its last batch taken (collective: call it on all processes)."""
        position = self._taken if self._taken is not None else self.dataset.state_dict()
        return {"num_processes": self.accelerator.num_processes, "positions": gather_object([position])}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from this process's saved position.

        Raises:
            ValueError: the checkpoint was written by another number of processes (the shards differ).
        """
        if state["num_processes"] != self.accelerator.num_processes:
            raise ValueError(
                f"the streamed checkpoint was written by {state['num_processes']} process(es), this run has "
                f"{self.accelerator.num_processes}: a stream's shards depend on the number of processes"
            )
        self.dataset.load_state_dict(state["positions"][self.accelerator.process_index])
        self._taken, self._resumed = None, True


class DeviceLoader:
    """Iterate a `DataLoader`, sending each batch to `device` (the streamed validation split, whole per process)."""

    def __init__(self, loader: DataLoader, device) -> None:
        self.loader, self.device = loader, device
        self.dataset = loader.dataset

    def __iter__(self) -> Iterator[dict[str, Any]]:
        """Yield the loader's batches on the device."""
        for batch in self.loader:
            yield send_to_device(batch, self.device)
