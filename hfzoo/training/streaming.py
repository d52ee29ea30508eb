"""Streamed pretraining data (`--streaming`): per-process shards of an `IterableDataset`, with a resumable position.

Documents are read lazily (`datasets` streaming), split between processes with
`datasets.distributed.split_dataset_by_node` (whole files per process when their number divides evenly,
else every `num_processes`-th document), then tokenized and packed on the fly
(`hfzoo.data.packing.pack_stream`: each block as soon as its documents are tokenized), so no two processes
train on the same block and nothing is materialized in memory or on disk. `StreamingTrainLoader` batches a
process's stream and is registered with accelerate's checkpointing: a checkpoint stores every process's
position in its stream (`PackedStream.state_dict`), and a resumed run continues with exactly the blocks the
uninterrupted run would have seen. Streams are read in order (no shuffle buffer, whose contents a checkpoint could
not restore).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
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

    Returns:
        `(train, validation)` `PackedStream`s of blocks; the validation stream is whole on every process.
    """
    train = split_dataset_by_node(raw["train"], rank=process_index, world_size=num_processes)
    train = pack_stream(train, tokenizer, text_column_name, block_size, clean, with_labels, max_train_samples)
    validation = pack_stream(raw["validation"], tokenizer, text_column_name, block_size, clean, with_labels,
                             max_eval_samples)  # fmt: skip
    return train, validation


class StreamingTrainLoader:
    """This process's batches of a streamed training split, on its device, with a checkpointable position.

    Iterating gives one pass over the stream (an epoch). `state_dict` gathers every process's stream
    position (so it must be called on all processes, as `accelerator.save_state` does); `load_state_dict`
    restores this process's, and the next pass continues from there.

    Args:
        dataset: this process's stream of blocks.
        batch_size: blocks per batch.
        collate_fn: the objective's collator.
        accelerator: gives the device, the rank and the world size.
        min_batches: fewer batches in a pass is an error (a pass must make at least one optimizer step).
    """

    def __init__(
        self,
        dataset: PackedStream,
        batch_size: int,
        collate_fn: Callable,
        accelerator: Accelerator,
        min_batches: int = 1,
    ) -> None:
        self.dataset = dataset
        # The loader's own generator: starting a pass draws its seed from it, not from torch's global RNG (which
        # the objectives' masking and dropout use), so a run resumed mid-pass draws what the uninterrupted one did.
        self.loader = DataLoader(dataset, batch_size=batch_size, collate_fn=collate_fn, generator=torch.Generator())
        self.accelerator = accelerator
        self.min_batches = min_batches

    def set_epoch(self, epoch: int) -> None:
        """Start pass `epoch` (the stream's epoch, part of its state)."""
        self.dataset.set_epoch(epoch)

    @property
    def epoch(self) -> int:
        """The current pass (restored with the position)."""
        return self.dataset.epoch

    def __iter__(self) -> Iterator[dict[str, Any]]:
        """Yield the batches of one pass on the process's device.

        Raises:
            ValueError: the pass yields fewer than `min_batches` batches.
        """
        count = 0
        for batch in self.loader:
            count += 1
            yield send_to_device(batch, self.accelerator.device)
        if count < self.min_batches:
            raise ValueError(
                f"process {self.accelerator.process_index}'s share of the training stream yields {count} batch(es) "
                f"in a pass, fewer than the {self.min_batches} of one optimizer step; give more data"
            )

    def state_dict(self) -> dict[str, Any]:
        """Every process's stream position (collective: call it on all processes)."""
        return {
            "num_processes": self.accelerator.num_processes,
            "positions": gather_object([self.dataset.state_dict()]),
        }

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


class DeviceLoader:
    """Iterate a `DataLoader`, sending each batch to `device` (the streamed validation split, whole per process)."""

    def __init__(self, loader: DataLoader, device) -> None:
        self.loader, self.device = loader, device
        self.dataset = loader.dataset

    def __iter__(self) -> Iterator[dict[str, Any]]:
        """Yield the loader's batches on the device."""
        for batch in self.loader:
            yield send_to_device(batch, self.device)
