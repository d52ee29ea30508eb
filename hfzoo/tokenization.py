"""Byte-level BPE tokenizer training for the model zoo's three families.

The tokenizer is the byte-pair-encoding subword model of Sennrich et al. (2016), "Neural Machine
Translation of Rare Words with Subword Units" (ACL), applied to bytes rather than characters as in
GPT-2 (Radford et al. 2019, "Language Models are Unsupervised Multitask Learners"): text is split
with GPT-2's pre-tokenization regex, every UTF-8 byte is mapped to one of 256 printable symbols,
and merges are learned on top of that 256-symbol alphabet. Every string therefore encodes without
an unknown token and decodes back to itself exactly.

Training uses the `tokenizers` library (`BpeTrainer` fed from an iterator, so memory stays bounded
by the number of distinct pre-tokenized words rather than the corpus size) and returns a
`transformers.PreTrainedTokenizerFast` with the special tokens, their roles and the family's
post-processor (what `add_special_tokens=True` adds) set, ready for `save_pretrained`.

The special tokens of each family are listed in `FAMILY_SPECIAL_TOKENS` at the bottom of this module.
"""

from __future__ import annotations

import itertools
import logging
import re
from collections.abc import Iterable, Iterator

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

from .choices import choice_hint

logger = logging.getLogger(__name__)

#: Number of byte-level base symbols (one per byte value); every vocabulary contains all of them.
BYTE_ALPHABET_SIZE = 256

#: Special-token roles understood by `transformers`, in the order new (override-only) roles are appended.
SPECIAL_TOKEN_ROLES = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)


class TextBatches:
    """Single-pass iterator over batches of texts that counts, and optionally caps, what it yields.

    Wraps the output of `hfzoo.data.loading.iter_texts` (or any iterable of strings or of lists of
    strings) so that a caller can report how much text a tokenizer was trained on, and stop early
    for quick runs. Empty strings are dropped. When `max_characters` is reached in the middle of a
    document, that document is truncated so that exactly `max_characters` characters are yielded.

    Attributes:
        documents: number of (non-empty) texts yielded so far.
        characters: number of characters yielded so far.
    """

    def __init__(
        self,
        text_batches: Iterable[str | list[str]],
        max_documents: int | None = None,
        max_characters: int | None = None,
    ):
        """Create the iterator.

        Args:
            text_batches: an iterable of batches (lists of strings) or of single strings.
            max_documents: stop after this many texts (None: no limit).
            max_characters: stop after this many characters (None: no limit).

        Raises:
            ValueError: a cap is given but smaller than 1.
        """
        if max_documents is not None and max_documents < 1:
            raise ValueError(f"max_documents must be >= 1 (or None for no limit), got {max_documents}")
        if max_characters is not None and max_characters < 1:
            raise ValueError(f"max_characters must be >= 1 (or None for no limit), got {max_characters}")
        self._source = text_batches
        self.max_documents = max_documents
        self.max_characters = max_characters
        self.documents = 0
        self.characters = 0

    def _full(self) -> bool:
        return (self.max_documents is not None and self.documents >= self.max_documents) or (
            self.max_characters is not None and self.characters >= self.max_characters
        )

    def __iter__(self) -> Iterator[list[str]]:
        """Yield non-empty lists of non-empty strings until the source or a cap is exhausted."""
        for batch in self._source:
            if self._full():
                return
            out = []
            for text in [batch] if isinstance(batch, str) else batch:
                if not text:
                    continue
                if self.max_characters is not None:
                    text = text[: self.max_characters - self.characters]
                out.append(text)
                self.documents += 1
                self.characters += len(text)
                if self._full():
                    break
            if out:
                yield out


def _refuse_special_tokens_in_text(batches: Iterator[list[str]], given: dict[str, str]) -> Iterator[list[str]]:
    """Pass `batches` through; raise ValueError at the first text holding one of the `given` special tokens.

    A special token is matched wherever its string occurs in text (transformers and `tokenizers` split it out
    before anything else), so a given token that ordinary text contains (`bos_token="a"`, a space) would turn
    every such occurrence into that token, silently. The family's own tokens (`<|endoftext|>`, `</s>`, ...) are
    not checked: data that holds them (WikiText's `<unk>`) reads them as the special tokens, as GPT-2's and T5's
    tokenizers do.

    Args:
        batches: non-empty lists of non-empty texts.
        given: what to call each token in the message (`"bos_token 'a'"`) -> the token.

    Raises:
        ValueError: naming the token, the document (counted from 1) and where in it the token occurs.
    """
    documents = 0
    for batch in batches:
        for name, token in given.items():
            for i, text in enumerate(batch):
                at = text.find(token)
                if at >= 0:
                    context = text[max(0, at - 20) : at + len(token) + 20]
                    raise ValueError(
                        f"{name} occurs in the training text (document {documents + i + 1}: {context!r}): a special "
                        "token is matched wherever its string occurs, so that text would be read as the special "
                        "token; choose a string that text does not contain, such as '<s>' or '<|sep|>'"
                    )
        documents += len(batch)
        yield batch


def check_vocab_size(vocab_size: int, model_family: str, num_special_tokens: int | None = None) -> None:
    """Refuse a vocabulary too small for the 256 byte symbols and the family's special tokens.

    Args:
        vocab_size: the vocabulary size asked for.
        model_family: a key of `FAMILY_SPECIAL_TOKENS`.
        num_special_tokens: the distinct special tokens (default: the family's own, with 100 sentinels for the
            encoder-decoder, as `train_bpe_tokenizer` and `hfzoo-train-tokenizer` give them by default).

    Raises:
        ValueError: `vocab_size` below `256 + num_special_tokens`, naming both numbers.
    """
    if num_special_tokens is None:
        num_special_tokens = len(family_special_tokens(model_family)[2])
    minimum = BYTE_ALPHABET_SIZE + num_special_tokens
    if vocab_size < minimum:
        raise ValueError(
            f"vocab_size={vocab_size} is too small for the {model_family!r} family: it must be at least "
            f"{minimum} ({BYTE_ALPHABET_SIZE} byte symbols + {num_special_tokens} special tokens)"
        )


def family_special_tokens(
    model_family: str = "decoder",
    num_extra_ids: int = 100,
    bos_token: str | None = None,
    eos_token: str | None = None,
    pad_token: str | None = None,
    unk_token: str | None = None,
    cls_token: str | None = None,
    sep_token: str | None = None,
    mask_token: str | None = None,
    additional_special_tokens: Iterable[str] | None = None,
) -> tuple[dict[str, str], list[str], list[str]]:
    """Resolve a family's special tokens, applying per-role overrides.

    Args:
        model_family: a key of `FAMILY_SPECIAL_TOKENS` (`decoder`, `encoder`, `encoder-decoder`).
        num_extra_ids: number of `<extra_id_N>` sentinel tokens (span-corruption targets, T5-style);
            used by the `encoder-decoder` family only.
        bos_token: replaces the family's bos token (or adds the role when the family has none).
        eos_token: same for the eos token.
        pad_token: same for the padding token.
        unk_token: same for the unknown token.
        cls_token: same for the classification token.
        sep_token: same for the separator token.
        mask_token: same for the mask token.
        additional_special_tokens: further special tokens without a role, appended after the
            family's tokens and sentinels.

    Returns:
        `(roles, extra, ordered)`: `roles` maps role names (`"bos_token"`, ...) to tokens; `extra`
        lists the special tokens without a role (sentinels, then `additional_special_tokens`);
        `ordered` lists every distinct special token in id order (family tokens in registry order,
        override-only roles, then `extra`).

    Raises:
        ValueError: unknown `model_family`, negative `num_extra_ids`, or an empty token string.
    """
    if model_family not in FAMILY_SPECIAL_TOKENS:
        raise ValueError(
            f"model_family {model_family!r} is unknown; {choice_hint(model_family, sorted(FAMILY_SPECIAL_TOKENS))}"
        )
    if num_extra_ids < 0:
        raise ValueError(f"num_extra_ids must be >= 0, got {num_extra_ids}")
    spec = FAMILY_SPECIAL_TOKENS[model_family]
    overrides = {
        "bos_token": bos_token,
        "eos_token": eos_token,
        "pad_token": pad_token,
        "unk_token": unk_token,
        "cls_token": cls_token,
        "sep_token": sep_token,
        "mask_token": mask_token,
    }
    for role, token in overrides.items():
        if token is not None and not token:
            raise ValueError(f"{role} must be a non-empty string")
    roles = dict(spec["special_tokens"])
    roles.update({role: token for role, token in overrides.items() if token is not None})
    extra = []
    if spec.get("extra_id_format") is not None:
        extra = [spec["extra_id_format"].format(i) for i in range(num_extra_ids)]
    for token in additional_special_tokens or ():
        if not token:
            raise ValueError("additional_special_tokens must not contain an empty string")
        extra.append(token)
    order = list(spec["special_tokens"]) + [r for r in SPECIAL_TOKEN_ROLES if r not in spec["special_tokens"]]
    ordered = [roles[r] for r in order if r in roles] + extra
    ordered = list(dict.fromkeys(ordered))  # drop duplicates (bos == eos), keep the first position
    extra = [t for t in dict.fromkeys(extra) if t not in roles.values()]
    return roles, extra, ordered


def _template(template: str, roles: dict[str, str]) -> str:
    for role in re.findall(r"{(\w+)}", template):
        if re.search(r"[\s:]", roles[role]):
            raise ValueError(f"{role} {roles[role]!r} cannot be used in a post-processor template: no spaces or ':'")
    return template.format(**roles)


def build_post_processor(model_family: str, roles: dict[str, str], token_ids: dict[str, int]):
    """Build the family's `TemplateProcessing` post-processor (what `add_special_tokens=True` adds).

    Args:
        model_family: a key of `FAMILY_SPECIAL_TOKENS`.
        roles: role -> token, as returned by `family_special_tokens`.
        token_ids: token -> id for (at least) the tokens the templates use.

    Returns:
        A `tokenizers.processors.TemplateProcessing`.
    """
    spec = FAMILY_SPECIAL_TOKENS[model_family]["post_processor"]
    single = _template(spec["single"], roles)
    pair = _template(spec["pair"], roles)
    used = dict.fromkeys(t.split(":")[0] for t in (single + " " + pair).split() if not t.startswith("$"))
    return processors.TemplateProcessing(
        single=single, pair=pair, special_tokens=[(token, token_ids[token]) for token in used]
    )


def train_bpe_tokenizer(
    text_batches: Iterable[str | list[str]],
    vocab_size: int,
    min_frequency: int = 2,
    model_family: str = "decoder",
    bos_token: str | None = None,
    eos_token: str | None = None,
    pad_token: str | None = None,
    unk_token: str | None = None,
    cls_token: str | None = None,
    sep_token: str | None = None,
    mask_token: str | None = None,
    additional_special_tokens: Iterable[str] | None = None,
    num_extra_ids: int = 100,
    show_progress: bool = False,
) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE tokenizer (Sennrich et al. 2016; GPT-2, Radford et al. 2019).

    The backend is a `tokenizers.Tokenizer` with a BPE model, no normalizer, GPT-2's ByteLevel
    pre-tokenizer (`add_prefix_space=False`, so text is encoded exactly as written) and ByteLevel
    decoder. The trainer starts from the full 256-symbol byte alphabet
    (`pre_tokenizers.ByteLevel.alphabet()`), so no input can ever produce an unknown token, and
    reads the texts from an iterator, so memory stays bounded. Special tokens get the lowest ids,
    in the order of `FAMILY_SPECIAL_TOKENS` (then override-only roles, sentinels, additional tokens).

    Post-processing (`add_special_tokens=True`) per family:

    * `decoder`: `<|endoftext|> $A` (pair: `<|endoftext|> $A <|endoftext|> $B`). The end-of-text
      token is *prepended* rather than appended: when encoded documents are concatenated and packed
      into fixed-length blocks, consecutive documents are still separated by `<|endoftext|>`, and a
      generation prompt starts exactly the way every training document starts (the first token the
      model sees is `<|endoftext|>`, as in GPT-2's unconditional samples). It is both the bos and the
      eos token, so generation stops when the model predicts the start of a new document; `<pad>` is
      a separate token so that masking padding never masks a document boundary.
    * `encoder`: BERT-style `[CLS] $A [SEP]`, pair `[CLS] $A [SEP] $B [SEP]` with token type ids 0
      for the first segment and 1 for the second.
    * `encoder-decoder`: T5-style `$A </s>`, pair `$A </s> $B </s>`; `<pad>` is id 0 (T5's decoder
      start token), `</s>` id 1, `<unk>` id 2, then `num_extra_ids` sentinels `<extra_id_0>`, ...

    Args:
        text_batches: iterable of batches (lists of strings) or of single strings, e.g. the output of
            `hfzoo.data.loading.iter_texts` (cleaned) or a `TextBatches`. Consumed once.
        vocab_size: the final vocabulary size, special tokens and the 256 byte symbols included.
            BPE stops earlier if no pair of symbols occurs `min_frequency` times any more (a warning
            is logged).
        min_frequency: minimum number of occurrences of a pair for it to be merged.
        model_family: `"decoder"`, `"encoder"` or `"encoder-decoder"` (see `FAMILY_SPECIAL_TOKENS`).
        bos_token: overrides the family's bos token (or adds the role).
        eos_token: overrides the family's eos token (or adds the role).
        pad_token: overrides the family's padding token (or adds the role).
        unk_token: overrides the family's unknown token (or adds the role). Byte-level BPE never
            produces it; it exists for compatibility with code that expects one.
        cls_token: overrides the family's classification token (or adds the role).
        sep_token: overrides the family's separator token (or adds the role).
        mask_token: overrides the family's mask token (or adds the role).
        additional_special_tokens: further special tokens (never split, no role).
        num_extra_ids: number of `<extra_id_N>` sentinels for the `encoder-decoder` family (ignored
            by the other families).
        show_progress: show the `tokenizers` progress bars.

    Returns:
        A `transformers.PreTrainedTokenizerFast` with the special-token roles, the family's
        post-processor and `model_input_names` set (`token_type_ids` only for `encoder`), and
        `model_max_length` left at its "no limit" default. The post-processor is stored in
        `tokenizer.json` and survives `save_pretrained` / `AutoTokenizer.from_pretrained`, as long as
        neither `add_bos_token` nor `add_eos_token` is passed (or written into
        `tokenizer_config.json`): in transformers v5 either one, even `False`, makes the tokenizer
        replace the post-processor with a plain `bos $A eos` template.

    Raises:
        ValueError: unknown `model_family`; `vocab_size` smaller than 256 + the number of special
            tokens; `min_frequency` < 1; `text_batches` holds no text at all; or a special token given here (a
            role's override or an additional token) occurs in the text: every occurrence would be read as that
            token (raised when the stream reaches it; the family's own tokens are not checked).
    """
    roles, extra, ordered = family_special_tokens(
        model_family,
        num_extra_ids=num_extra_ids,
        bos_token=bos_token,
        eos_token=eos_token,
        pad_token=pad_token,
        unk_token=unk_token,
        cls_token=cls_token,
        sep_token=sep_token,
        mask_token=mask_token,
        additional_special_tokens=additional_special_tokens,
    )
    check_vocab_size(vocab_size, model_family, len(ordered))
    if min_frequency < 1:
        raise ValueError(f"min_frequency must be >= 1, got {min_frequency}")
    # The trainer gives the special tokens ids 0, 1, ... in order, so the post-processor (and the
    # validation of the tokens it uses) can be built before training.
    special_ids = {token: i for i, token in enumerate(ordered)}
    post_processor = build_post_processor(model_family, roles, special_ids)

    # Look for the first non-empty text before training, so that empty data fails with a clear message.
    # Normalise to non-empty lists of non-empty strings.
    batches = ([t for t in ([b] if isinstance(b, str) else b) if t] for b in text_batches)
    batches = (b for b in batches if b)
    family = FAMILY_SPECIAL_TOKENS[model_family]["special_tokens"]
    given = {f"{role} {token!r}": token for role, token in roles.items() if family.get(role) != token}  # overrides
    given.update({f"additional_special_tokens entry {t!r}": t for t in additional_special_tokens or ()})
    batches = _refuse_special_tokens_in_text(batches, given)
    first = next(batches, None)
    if first is None:
        raise ValueError("no text to train on: the data holds no non-empty text")

    tokenizer = Tokenizer(models.BPE(unk_token=roles.get("unk_token")))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=[AddedToken(t, special=True, normalized=False) for t in ordered],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=show_progress,
    )
    tokenizer.train_from_iterator(itertools.chain([first], batches), trainer=trainer)

    trained_size = tokenizer.get_vocab_size()
    if trained_size < vocab_size:
        logger.warning(
            "BPE stopped at %d tokens (< vocab_size=%d): no pair of symbols occurs min_frequency=%d times "
            "any more; train on more text or lower min_frequency",
            trained_size,
            vocab_size,
            min_frequency,
        )
    trained_ids = {token: tokenizer.token_to_id(token) for token in ordered}
    if trained_ids != special_ids:  # cannot happen with tokenizers' BpeTrainer; guards the templates
        raise RuntimeError(f"special tokens got ids {trained_ids}, expected {special_ids}")
    tokenizer.post_processor = post_processor

    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        **roles,
        extra_special_tokens=extra,
        model_input_names=list(FAMILY_SPECIAL_TOKENS[model_family]["model_input_names"]),
        clean_up_tokenization_spaces=False,
    )


#: Per model family: the special tokens by role (ids assigned in this order, duplicates once),
#: the post-processor templates (`{role}` is replaced by that role's token; `:1` marks token type
#: id 1), the inputs the model takes, and for `encoder-decoder` the sentinel name pattern.
FAMILY_SPECIAL_TOKENS = {
    "decoder": {
        "special_tokens": {"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>", "pad_token": "<pad>"},
        "post_processor": {"single": "{bos_token} $A", "pair": "{bos_token} $A {bos_token} $B"},
        "model_input_names": ["input_ids", "attention_mask"],
    },
    "encoder": {
        "special_tokens": {
            "pad_token": "[PAD]",
            "unk_token": "[UNK]",
            "cls_token": "[CLS]",
            "sep_token": "[SEP]",
            "mask_token": "[MASK]",
        },
        "post_processor": {
            "single": "{cls_token} $A {sep_token}",
            "pair": "{cls_token} $A {sep_token} $B:1 {sep_token}:1",
        },
        "model_input_names": ["input_ids", "token_type_ids", "attention_mask"],
    },
    "encoder-decoder": {
        "special_tokens": {"pad_token": "<pad>", "eos_token": "</s>", "unk_token": "<unk>"},
        "extra_id_format": "<extra_id_{}>",
        "post_processor": {"single": "$A {eos_token}", "pair": "$A {eos_token} $B {eos_token}"},
        "model_input_names": ["input_ids", "attention_mask"],
    },
}
