"""Samples to compact journal blobs and back: :func:`encode_samples`, :func:`decode_samples`.

One msgpack map per sample with short keys, encoded at C speed (msgspec): token ids as
msgpack ints (1-5 bytes each), log-probs as float64 (a log-prob comes back bit for bit, so
a training batch rebuilt from the journal hashes the same); a loss mask of ones as its
length (it comes back as int ones: equal, and the training batch is the same). Plain
msgpack lists, not ``array`` bytes: 5 us for a 512-token sample against 23 us. Diffusion
tensors (``generated_output``, ``dit_trajectory``, ``denoising_env``, debug tensors, tensor
log-probs) are referenced, not copied: the blob keeps each one's dtype and shape under
``metadata["journal_tensors"]`` of the decoded sample, and the tensor fields come back
``None``. ``multimodal_inputs`` (raw media) are not kept either. Labels and metadata
must be msgpack values (str, numbers, lists, dicts); anything else is kept as its
``repr``.
"""

from __future__ import annotations

from typing import Any

import msgspec

import miles_lite.errors as errors
from miles_lite.types import PrefixCacheInfo, Sample, SampleStatus, SessionInfo, WeightSpan

__all__ = [
    "decode_samples",
    "encode_handed",
    "encode_samples",
    "encode_value",
    "error_from_record",
    "handed_entries",
]


def _fallback(value: Any) -> Any:
    return repr(value)


_encoder = msgspec.msgpack.Encoder(enc_hook=_fallback)
_decoder = msgspec.msgpack.Decoder()


def encode_value(value: Any) -> bytes:
    """``value`` as msgpack (what is not a msgpack value is kept as its ``repr``)."""
    return _encoder.encode(value)


def decode_value(blob: bytes | None) -> Any:
    """The value :func:`encode_value` wrote (``None`` for ``None``)."""
    return None if blob is None else _decoder.decode(blob)


def _tensor_refs(sample: Sample) -> dict[str, list[Any]]:
    """Each tensor of a diffusion sample as ``[dtype, shape]`` (the tensors stay out)."""
    refs: dict[str, list[Any]] = {}

    def ref(name: str, value: Any) -> None:
        if value is not None and hasattr(value, "shape") and hasattr(value, "dtype"):
            refs[name] = [str(value.dtype), list(value.shape)]

    ref("generated_output", sample.generated_output)
    if not isinstance(sample.rollout_log_probs, list):
        ref("rollout_log_probs", sample.rollout_log_probs)
    trajectory = sample.dit_trajectory
    if trajectory is not None:
        ref("dit_trajectory.latents", trajectory.latents)
        ref("dit_trajectory.timesteps", trajectory.timesteps)
        ref("dit_trajectory.sigmas", trajectory.sigmas)
    for field_name in ("denoising_env", "rollout_debug_tensors"):
        for key, value in (getattr(sample, field_name) or {}).items():
            ref(f"{field_name}.{key}", value)
    return refs


def _record(sample: Sample) -> dict[str, Any]:
    log_probs = sample.rollout_log_probs
    error = sample.error
    record: dict[str, Any] = {
        "i": sample.index,
        "p": sample.prompt,
        "l": sample.label,
        "s": sample.status.value,
        "r": sample.reward,
        "m": sample.metadata,
        "t": sample.tokens,
        "rl": sample.response_length,
        "rs": sample.response,
        "lm": _mask_record(sample.loss_mask),
        "lp": log_probs if isinstance(log_probs, list) else None,
        "wv": sample.weight_versions,
        "ws": [[w.version, w.start, w.end, w.kv_version] for w in sample.weight_spans],
        "se": sample.seed,
    }
    if error is not None:
        record["e"] = _error_record(error)
    # Fields mostly at their defaults are written only when set (smaller blobs).
    optional = {
        "fr": sample.finish_reason,
        "ms": sample.matched_stop,
        "sr": sample.status_reason,
        "tu": sample.turns or None,
        "ri": sample.request_id,
        "ng": sample.non_generation_time or None,
        "it": sample.inference_time_s,
        "pm": sample.peak_memory_mb,
    }
    record.update({key: value for key, value in optional.items() if value is not None})
    cache = sample.prefix_cache_info
    if cache.total_prompt_tokens:
        record["pc"] = [cache.cached_tokens, cache.total_prompt_tokens]
    if sample.session is not None:
        record["ss"] = [sample.session.id, sample.session.turns, sample.session.tito_mismatches]
    if sample.generated_output is not None or sample.dit_trajectory is not None:
        record["tn"] = _tensor_refs(sample)
    return record


def _mask_record(mask: list[int] | None) -> list[int] | int | None:
    """A loss mask of ones (the usual one: every response token trained) as its length, at
    C speed (about 0.5 us for 512 against 3 to encode the list); any other as it is."""
    if mask and mask.count(1) == len(mask):
        return len(mask)
    return mask


def encode_samples(samples: list[Sample]) -> bytes:
    """``samples`` as one blob (see the module docstring for what is kept)."""
    return _encoder.encode([_record(s) for s in samples])


def _error_record(error: errors.MilesLiteError | None) -> list[Any] | None:
    if error is None:
        return None
    return [type(error).__name__, error.message, error.url, error.request_id]


def encode_handed(samples: list[Sample], refs: list[tuple[int, int] | None]) -> bytes:
    """A handed group: each sample whose generate call's record is journaled (``refs``:
    its place and attempt) as a reference to that record plus what changed after it (index,
    status, reward, error: scoring comes after generating); any other sample whole."""
    entries: list[Any] = []
    for sample, ref in zip(samples, refs, strict=True):
        if ref is None:
            entries.append(_record(sample))
        else:
            entries.append(
                [
                    *ref,
                    sample.index,
                    sample.status.value,
                    sample.reward,
                    _error_record(sample.error),
                ]
            )
    return _encoder.encode(entries)


def handed_entries(blob: bytes) -> list[Any]:
    """The entries :func:`encode_handed` wrote: a full record (a dict) or a reference
    ``[slot, attempt, index, status, reward, error]``."""
    return _decoder.decode(blob)  # type: ignore[no-any-return]


def resolve_entry(entry: Any, referenced: bytes | None, group_index: int) -> Sample:
    """The sample of one handed entry (``referenced``: the record a reference names)."""
    if isinstance(entry, dict):
        return _sample(entry, group_index)
    if referenced is None:
        raise errors.JournalError(
            f"a handed sample references record (place {entry[0]}, attempt {entry[1]}),"
            " which the journal does not hold: the file is not whole"
        )
    (record,) = _decoder.decode(referenced)
    record["i"], record["s"], record["r"] = entry[2], entry[3], entry[4]
    record.pop("e", None)
    if entry[5] is not None:
        record["e"] = entry[5]
    return _sample(record, group_index)


def error_from_record(record: list[Any]) -> errors.MilesLiteError:
    """The typed error a journaled ``[class name, message, url, request id]`` names (its
    class from :mod:`miles_lite.errors`, else ``MilesLiteError``), rebuilt without calling
    its constructor (some take more than a message)."""
    name, message, url, request_id = record
    cls = getattr(errors, name, errors.MilesLiteError)
    if not (isinstance(cls, type) and issubclass(cls, errors.MilesLiteError)):
        cls = errors.MilesLiteError
    error = cls.__new__(cls)
    Exception.__init__(error, message)
    error.message, error.url, error.request_id = message, url, request_id
    return error


def _sample(record: dict[str, Any], group_index: int) -> Sample:
    metadata = record["m"]
    if "tn" in record:
        metadata = {**metadata, "journal_tensors": record["tn"]}
    sample = Sample(
        index=record["i"],
        group_index=group_index,
        prompt=record["p"],
        label=record["l"],
        status=SampleStatus(record["s"]),
        reward=record["r"],
        metadata=metadata,
        tokens=record["t"],
        response=record["rs"],
        response_length=record["rl"],
        loss_mask=[1] * mask if isinstance(mask := record["lm"], int) else mask,
        rollout_log_probs=record["lp"],
        weight_versions=record["wv"],
        weight_spans=[WeightSpan(v, s, e, k) for v, s, e, k in record["ws"]],
        seed=record["se"],
        finish_reason=record.get("fr"),
        matched_stop=record.get("ms"),
        status_reason=record.get("sr"),
        turns=record.get("tu") or 0,
        request_id=record.get("ri"),
        non_generation_time=record.get("ng") or 0.0,
        inference_time_s=record.get("it"),
        peak_memory_mb=record.get("pm"),
    )
    if "e" in record:
        sample.error = error_from_record(record["e"])
    if "pc" in record:
        sample.prefix_cache_info = PrefixCacheInfo(*record["pc"])
    if "ss" in record:
        sample.session = SessionInfo(*record["ss"])
    return sample


def decode_samples(blob: bytes, group_index: int = 0) -> list[Sample]:
    """The samples :func:`encode_samples` wrote, with ``group_index`` set."""
    return [_sample(r, group_index) for r in _decoder.decode(blob)]
