"""Pure functions between SGLang diffusion bodies (msgpack or base64/JSON) and tensors."""

from miles_lite.codecs.body import (
    ALIGNMENT,
    DecodedBody,
    decode_body,
    decode_json,
    decode_msgpack,
    iter_refs,
    wire_form,
)
from miles_lite.codecs.tensor_map import WIRE_DTYPES, TensorRef, is_tensor_map, parse_safetensors

__all__ = [
    "ALIGNMENT",
    "WIRE_DTYPES",
    "DecodedBody",
    "TensorRef",
    "decode_body",
    "decode_json",
    "decode_msgpack",
    "is_tensor_map",
    "iter_refs",
    "parse_safetensors",
    "wire_form",
]
