"""What differs between the transformers (and PEFT) releases hfzoo accepts (`transformers>=5.23,<6`), in one place.

transformers 5.24 renamed the key/value cache from `past_key_values` to `cache` everywhere it passes:
the argument `generate` hands a model's `forward`, the field of every `ModelOutput`, and the argument of
`masking_utils.create_causal_mask` / `create_bidirectional_mask` (the old names stay as deprecated aliases
until 5.40). hfzoo's own code says `cache`; this module names the field and the mask argument the installed
release expects and the name the installed PEFT expects (`peft_cache_name`), and `accept_legacy_cache_name`
lets every hfzoo `forward` take both names, through transformers' own `deprecate_kwarg`.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
from collections.abc import Callable

import transformers
from transformers.modeling_outputs import BaseModelOutputWithPast
from transformers.utils.deprecation import deprecate_kwarg

#: The name under which the installed transformers passes a cache to `forward`, stores it in a `ModelOutput`
#: and takes it in `masking_utils`: "cache" from transformers 5.24 on, "past_key_values" before.
CACHE_NAME = "cache" if "cache" in {f.name for f in dataclasses.fields(BaseModelOutputWithPast)} else "past_key_values"
#: The cache's name before transformers 5.24, accepted by every hfzoo `forward` on every release.
LEGACY_CACHE_NAME = "past_key_values"
#: The release from which transformers removes `LEGACY_CACHE_NAME` from its own models (its `deprecate_kwarg`).
LEGACY_CACHE_REMOVAL = "5.40.0"


def cache_field(cache) -> dict:
    """`{name: cache}` for a `ModelOutput` or a `masking_utils` call, under the installed transformers' name.

    Args:
        cache: a transformers `Cache`, or None.

    Returns:
        `{"cache": cache}` on transformers >= 5.24, `{"past_key_values": cache}` before.
    """
    return {CACHE_NAME: cache}


def output_cache(outputs):
    """The cache of a transformers `ModelOutput` (None when it holds none), on every accepted release.

    Reading `outputs.past_key_values` on transformers >= 5.24 logs a deprecation warning; this reads the
    installed release's field.
    """
    return getattr(outputs, CACHE_NAME, None)


def peft_cache_name() -> str:
    """The name under which the installed PEFT reads and writes the cache among `generate`'s prepared inputs.

    PEFT before 0.22 always says `past_key_values`; from 0.22 on it says what the installed transformers says
    (`peft.import_utils.get_transformers_cache_name`: `cache` from transformers 5.24 on). Called only while a PEFT
    model generates, so PEFT is installed and imported.

    Returns:
        "cache" or "past_key_values".
    """
    name_of_transformers_cache = getattr(
        importlib.import_module("peft.import_utils"), "get_transformers_cache_name", None
    )
    return LEGACY_CACHE_NAME if name_of_transformers_cache is None else name_of_transformers_cache()


def accept_legacy_cache_name(forward: Callable) -> Callable:
    """Make a `forward(..., cache=None, ...)` also accept the cache as `past_key_values`.

    transformers' `deprecate_kwarg` renames `past_key_values` to `cache` before the call. On transformers
    >= 5.24, where `past_key_values` is deprecated, it warns as transformers' own models do (`FutureWarning`,
    removal in 5.40); on 5.23, where `past_key_values` is the name `generate` and PEFT use, it renames
    silently. The signature that `inspect.signature` reports lists both names, because callers look for
    them there (PEFT's prefix tuning requires `past_key_values`; `generate` matches its inputs to it).

    Args:
        forward: a `forward` method with a `cache` parameter.

    Returns:
        The wrapped method.

    Raises:
        TypeError: `forward` has no `cache` parameter (a programming error, at class creation).
        ValueError: (from the wrapped method) both `cache` and `past_key_values` are given.
    """
    signature = inspect.signature(forward)
    if "cache" not in signature.parameters:
        raise TypeError(f"{forward.__qualname__} has no `cache` parameter to alias `past_key_values` to")
    installed = transformers.__version__
    # A deprecation whose version has passed only renames (transformers' `deprecate_kwarg` semantics).
    version = LEGACY_CACHE_REMOVAL if CACHE_NAME == "cache" else installed
    wrapped = deprecate_kwarg(LEGACY_CACHE_NAME, version, new_name="cache", raise_if_both_names=True)(forward)
    parameters = list(signature.parameters.values())
    annotation = signature.parameters["cache"].annotation
    legacy = inspect.Parameter(LEGACY_CACHE_NAME, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=annotation)
    at = next((i for i, p in enumerate(parameters) if p.kind is inspect.Parameter.VAR_KEYWORD), len(parameters))
    parameters.insert(at, legacy)
    wrapped.__signature__ = signature.replace(parameters=parameters)
    return wrapped
