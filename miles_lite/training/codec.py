"""Samples to compact journal blobs and back: :func:`encode_samples`, :func:`decode_samples`.

One msgpack array per sample, its fields by position (no keys), encoded at C speed
(msgspec): token ids as msgpack ints (1-5 bytes each), log-probs as float64 (a log-prob
comes back bit for bit, so a training batch rebuilt from the journal hashes the same); a
loss mask of ones as its length (it comes back as int ones: equal, and the training batch
is the same). Plain msgpack lists, not ``array`` bytes: 5 us for a 512-token sample
against 23 us. Diffusion tensors (``generated_output``, ``dit_trajectory``,
``denoising_env``, debug tensors, tensor log-probs) are referenced, not copied: the blob
keeps each one's dtype and shape under ``metadata["journal_tensors"]`` of the decoded
sample, and the tensor fields come back ``None``. ``multimodal_inputs`` (raw media) are
not kept either. Labels and metadata must be msgpack values (str, numbers, lists, dicts);
anything else is kept as its ``repr``. A record that is not one of this layout is a
:class:`~miles_lite.errors.JournalError`, never half-read.
"""

from __future__ import annotations

from typing import Any

import msgspec

import miles_lite.errors as errors
from miles_lite.types import PrefixCacheInfo, Sample, SampleStatus, SessionInfo, WeightSpan

__all__ = [
    "RECORD_FIELDS",
    "decode_samples",
    "encode_handed",
    "encode_samples",
    "encode_value",
    "error_from_record",
    "handed_entries",
    "is_reference",
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


#: Where each field sits in a record: one msgpack array a sample, by position (no keys to
#: build or write: 6-7 us to encode a 512-token sample hot, against 8-10 as a keyed map).
(
    _INDEX,
    _PROMPT,
    _LABEL,
    _STATUS,
    _REWARD,
    _METADATA,
    _TOKENS,
    _RESPONSE_LENGTH,
    _RESPONSE,
    _LOSS_MASK,
    _LOG_PROBS,
    _WEIGHT_VERSIONS,
    _WEIGHT_SPANS,
    _SEED,
    _ERROR,
    _FINISH_REASON,
    _MATCHED_STOP,
    _STATUS_REASON,
    _TURNS,
    _REQUEST_ID,
    _NON_GENERATION_TIME,
    _INFERENCE_TIME,
    _PEAK_MEMORY,
    _PREFIX_CACHE,
    _SESSION,
    _TENSORS,
    RECORD_FIELDS,
) = range(27)


def _record(sample: Sample) -> tuple[Any, ...]:
    """``sample`` as a record: a tuple of :data:`RECORD_FIELDS` values, by position."""
    log_probs = sample.rollout_log_probs
    spans = sample.weight_spans
    cache = sample.prefix_cache_info
    session = sample.session
    return (
        sample.index,
        sample.prompt,
        sample.label,
        sample.status.value,
        sample.reward,
        sample.metadata,
        sample.tokens,
        sample.response_length,
        sample.response,
        _mask_record(sample.loss_mask),
        log_probs if isinstance(log_probs, list) else None,
        sample.weight_versions,
        [(w.version, w.start, w.end, w.kv_version) for w in spans] if spans else None,
        sample.seed,
        _error_record(sample.error),
        sample.finish_reason,
        sample.matched_stop,
        sample.status_reason,
        sample.turns,
        sample.request_id,
        sample.non_generation_time,
        sample.inference_time_s,
        sample.peak_memory_mb,
        (cache.cached_tokens, cache.total_prompt_tokens) if cache.total_prompt_tokens else None,
        None if session is None else (session.id, session.turns, session.tito_mismatches),
        _tensor_refs(sample)
        if sample.generated_output is not None or sample.dit_trajectory is not None
        else None,
    )


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
                (
                    *ref,
                    sample.index,
                    sample.status.value,
                    sample.reward,
                    _error_record(sample.error),
                )
            )
    return _encoder.encode(entries)


#: How long a handed entry that references a record is (a whole record is longer).
_REFERENCE_FIELDS = 6


def handed_entries(blob: bytes) -> list[Any]:
    """The entries :func:`encode_handed` wrote: a whole record (:data:`RECORD_FIELDS`
    long) or a reference ``[slot, attempt, index, status, reward, error]``."""
    return _decoder.decode(blob)  # type: ignore[no-any-return]


def is_reference(entry: list[Any]) -> bool:
    """Whether a handed entry references a record (else it is the whole record)."""
    return len(entry) == _REFERENCE_FIELDS


def resolve_entry(entry: list[Any], referenced: bytes | None, group_index: int) -> Sample:
    """The sample of one handed entry (``referenced``: the record a reference names)."""
    if not is_reference(entry):
        return _sample(entry, group_index)
    if referenced is None:
        raise errors.JournalError(
            f"a handed sample references record (place {entry[0]}, attempt {entry[1]}),"
            " which the journal does not hold: the file is not whole"
        )
    (record,) = _decoder.decode(referenced)
    record[_INDEX], record[_STATUS], record[_REWARD] = entry[2], entry[3], entry[4]
    record[_ERROR] = entry[5]
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


def _sample(record: list[Any], group_index: int) -> Sample:
    if not isinstance(record, list) or len(record) != RECORD_FIELDS:
        raise errors.JournalError(
            f"a journaled sample record is not an array of {RECORD_FIELDS} fields"
            f" ({type(record).__name__} of {len(record)}): the file is not whole"
        )
    metadata = record[_METADATA]
    tensors = record[_TENSORS]
    if tensors is not None:
        metadata = {**metadata, "journal_tensors": tensors}
    mask = record[_LOSS_MASK]
    spans = record[_WEIGHT_SPANS]
    sample = Sample(
        index=record[_INDEX],
        group_index=group_index,
        prompt=record[_PROMPT],
        label=record[_LABEL],
        status=SampleStatus(record[_STATUS]),
        reward=record[_REWARD],
        metadata=metadata,
        tokens=record[_TOKENS],
        response=record[_RESPONSE],
        response_length=record[_RESPONSE_LENGTH],
        loss_mask=[1] * mask if isinstance(mask, int) else mask,
        rollout_log_probs=record[_LOG_PROBS],
        weight_versions=record[_WEIGHT_VERSIONS],
        weight_spans=[WeightSpan(v, s, e, k) for v, s, e, k in spans or ()],
        seed=record[_SEED],
        finish_reason=record[_FINISH_REASON],
        matched_stop=record[_MATCHED_STOP],
        status_reason=record[_STATUS_REASON],
        turns=record[_TURNS],
        request_id=record[_REQUEST_ID],
        non_generation_time=record[_NON_GENERATION_TIME],
        inference_time_s=record[_INFERENCE_TIME],
        peak_memory_mb=record[_PEAK_MEMORY],
    )
    if record[_ERROR] is not None:
        sample.error = error_from_record(record[_ERROR])
    if record[_PREFIX_CACHE] is not None:
        sample.prefix_cache_info = PrefixCacheInfo(*record[_PREFIX_CACHE])
    if record[_SESSION] is not None:
        sample.session = SessionInfo(*record[_SESSION])
    return sample


def decode_samples(blob: bytes, group_index: int = 0) -> list[Sample]:
    """The samples :func:`encode_samples` wrote, with ``group_index`` set."""
    return [_sample(r, group_index) for r in _decoder.decode(blob)]
