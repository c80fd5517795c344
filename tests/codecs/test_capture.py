"""The real SGLang capture decodes, matches the copying reference, and re-encodes exactly."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgpack
import pytest
import torch
from safetensors.torch import load

from miles_lite.codecs.body import decode_msgpack, iter_refs
from miles_lite.codecs.tensors import decode_to_tensors, materialize
from miles_lite.testing import encode_json_body, encode_msgpack_body, encode_msgpack_pieces
from tests.codecs.wire import SAMPLE_KEYS, aligned_buffer, iter_tensors, same_tree

CAPTURE = "rollout_generate_sample.msgpack"

#: Documented shapes of the capture: 2 samples, 3 SDE steps, 4x8x8 latents.
SHAPES = {
    ("generated_output",): (3, 1, 16, 16),
    ("rollout_log_probs",): (3,),
    ("rollout_debug_tensors", "rollout_variance_noises"): (3, 4, 8, 8),
    ("rollout_debug_tensors", "rollout_prev_sample_means"): (3, 4, 8, 8),
    ("rollout_debug_tensors", "rollout_noise_std_devs"): (3,),
    ("rollout_debug_tensors", "rollout_model_outputs"): (3, 4, 8, 8),
    ("denoising_env", "pos_cond_kwargs", "encoder_hidden_states"): (5, 16),
    ("denoising_env", "guidance"): (1,),
    ("dit_trajectory", "latents"): (4, 4, 8, 8),
    ("dit_trajectory", "timesteps"): (3,),
    ("dit_trajectory", "sigmas"): (4,),
}


@pytest.fixture
def capture(captures: Path) -> bytes:
    return (captures / CAPTURE).read_bytes()


def _get(tree: dict[str, Any], path: tuple[str, ...]) -> Any:
    for key in path:
        tree = tree[key]
    return tree


def _reference(body: bytes) -> Any:
    """The copying decoder: msgpack-python, then safetensors for every tensor map."""

    def walk(v: Any) -> Any:
        if isinstance(v, dict):
            if v.get("__tensor__") is True:
                return load(v["data"])["t"]
            return {k: walk(x) for k, x in v.items()}
        if isinstance(v, list):
            return [walk(x) for x in v]
        return v

    return walk(msgpack.unpackb(body))


def test_capture_decodes_to_two_samples_with_the_documented_keys(capture: bytes) -> None:
    items = decode_to_tensors(bytearray(capture), "application/msgpack")
    assert len(items) == 2
    for sample in items:
        assert tuple(sample) == SAMPLE_KEYS
        assert sample["request_id"] == "req-abc"
        assert sample["prompt"] == "a cat"
        assert sample["seed"] == 42
        assert sample["denoising_env"]["neg_cond_kwargs"] is None
        assert sample["denoising_env"]["pos_cond_kwargs"]["txt_seq_lens"] == [5, 5]
        assert sample["denoising_env"]["image_kwargs"] == {"img_shapes": [[[1, 4, 4]]]}


def test_capture_tensors_have_the_documented_shapes_and_float32(capture: bytes) -> None:
    items = decode_to_tensors(bytearray(capture), "application/msgpack")
    for sample in items:
        for path, shape in SHAPES.items():
            t = _get(sample, path)
            assert isinstance(t, torch.Tensor), path
            assert t.shape == shape, path
            assert t.dtype == torch.float32, path
        assert len(list(iter_tensors(sample))) == len(SHAPES)


def test_capture_refs_point_into_the_body_without_blobs(capture: bytes) -> None:
    decoded = decode_msgpack(memoryview(capture))
    assert decoded.in_place
    assert decoded.nbytes == len(capture)
    refs = list(iter_refs(decoded.items))
    assert len(refs) == 2 * len(SHAPES)
    assert all(r.offset > 0 and r.offset + r.nbytes <= len(capture) for r in refs)
    assert decoded.tensor_bytes() == sum(r.nbytes for r in refs)


def test_capture_decodes_like_the_copying_reference(capture: bytes) -> None:
    ours = decode_to_tensors(bytearray(capture), "application/msgpack")
    assert same_tree(ours, _reference(capture))


def test_capture_decoded_with_alignment_matches_the_reference(capture: bytes) -> None:
    buf = aligned_buffer(capture)
    decoded = decode_msgpack(memoryview(buf), align=True)
    assert all(r.offset % 64 == 0 for r in iter_refs(decoded.items))
    tensors = materialize(decoded.items, buf)
    assert all(t.data_ptr() % 64 == 0 for t in iter_tensors(tensors))
    assert same_tree(tensors, _reference(capture))


def test_capture_reencodes_byte_for_byte(capture: bytes) -> None:
    items = decode_to_tensors(bytearray(capture), "application/msgpack")
    assert encode_msgpack_body(items) == capture


def test_capture_reencodes_byte_for_byte_from_pieces(capture: bytes) -> None:
    items = decode_to_tensors(bytearray(capture), "application/msgpack")
    assert b"".join(encode_msgpack_pieces(items)) == capture


def test_capture_in_json_form_decodes_to_the_same_tensors(capture: bytes) -> None:
    items = decode_to_tensors(bytearray(capture), "application/msgpack")
    again = decode_to_tensors(encode_json_body(items), "application/json")
    assert same_tree(again, items)
