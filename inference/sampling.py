"""Settings as a descriptor holds them, for every backend: plain JSON values, and sampling spelled one way.

Contract: :func:`json_value` turns a setting into plain JSON or refuses it
with :class:`~store.errors.InvalidInputError` (it must be hashable into a
descriptor); :func:`sampling_settings_from` turns ``SamplingParams``-style
kwargs into typed :class:`~store.descriptor.SamplingSettings`, the same way
for the in-process engine (:mod:`inference.backends.vllm.descriptor`) and hosted
servers (:mod:`inference.backends.hosted.descriptor`), so both hash a setting alike.
:func:`random_sampling` says whether two identical requests get different
answers at a sampling (what the drop-in entry points answer repeats by).
"""

from __future__ import annotations

import enum
import math
import os
from collections.abc import Mapping
from typing import Any

from pydantic import JsonValue, ValidationError

from store.descriptor import LogprobPositions, SamplingSettings, canonical_json
from store.errors import InvalidInputError, invalid_values


def json_value(value: Any, where: str) -> JsonValue:
    """``value`` as plain JSON (paths as strings, sets sorted), or a clear error (NaN and infinities included:
    JSON has no number for them, and a descriptor holding one would hash like one holding null)."""
    if isinstance(value, float) and not math.isfinite(value):
        raise InvalidInputError(f"setting {where!r} = {value!r} is not a finite number")
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, enum.Enum):
        return json_value(value.value, where)
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if isinstance(value, Mapping):
        return {str(k): json_value(v, f"{where}.{k}") for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_value(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, set | frozenset):
        return sorted((json_value(v, where) for v in value), key=lambda v: canonical_json(v))
    raise InvalidInputError(
        f"setting {where!r} = {value!r:.80} cannot be written into a descriptor; "
        "pass it as plain JSON (a dict, list, string or number)"
    )


def sampling_settings_from(
    sampling: Mapping[str, Any], logprob_positions: LogprobPositions = "first"
) -> SamplingSettings:
    """``SamplingParams``-style kwargs as typed :class:`SamplingSettings`, spelled one way.

    ``n`` must be 1 (samples are asked for per request); a ``stop`` string is a
    one-item list, and ``stop=None`` the empty one; ``seed=-1`` (vLLM's "no seed") is None; ``logprobs=True``
    is 1. Unknown settings are kept. Shared by the in-process engine and
    hosted APIs (:mod:`inference.backends.hosted.descriptor`), so both hash a setting alike.
    """
    sampling = dict(sampling)
    if sampling.pop("n", 1) != 1:
        raise InvalidInputError("sampling 'n' must be 1: ask for more samples per request instead")
    if isinstance(sampling.get("stop"), str):
        sampling["stop"] = [sampling["stop"]]
    if "stop" in sampling and sampling["stop"] is None:  # SamplingParams' "no stop strings", as []
        sampling["stop"] = []
    if sampling.get("seed") == -1:  # vLLM reads -1 as "no seed"
        sampling["seed"] = None
    if sampling.get("logprobs") is True:  # and True as 1
        sampling["logprobs"] = 1
    try:
        settings = SamplingSettings(**{k: json_value(v, f"sampling.{k}") for k, v in sampling.items()})
    except ValidationError as e:
        raise InvalidInputError(f"invalid sampling settings: {invalid_values(e)}") from e
    if logprob_positions != "first" and settings.logprobs is None:
        raise InvalidInputError(f"logprob_positions={logprob_positions!r} needs logprobs (a number of candidates)")
    return settings


def random_sampling(sampling: SamplingSettings) -> bool:
    """Whether two identical requests get different answers from an engine without a cache: a temperature above 0,
    no seed (vLLM applies a request's seed alike to both), and more than the most likely token to sample from."""
    return sampling.temperature != 0 and sampling.seed is None and sampling.top_k != 1
