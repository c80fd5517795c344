"""A tiny random CLIP (config + real BPE tokenizer files) for tests and demos without a hub."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import CLIPConfig

__all__ = ["tiny_clip"]

_BOS = "<|startoftext|>"
_EOS = "<|endoftext|>"


def _byte_alphabet() -> list[str]:
    # GPT-2/CLIP's byte-to-unicode table: 256 printable characters, one per byte, in the
    # order the real CLIP vocab.json lists them. Byte-level BPE needs every byte covered.
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    chars = list(printable)
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return [chr(c) for c in chars]


def tiny_clip(tmp_dir: str | os.PathLike[str]) -> tuple[CLIPConfig, Path]:
    """Build a tiny ``CLIPConfig`` and write a matching CLIP tokenizer into ``tmp_dir``.

    The config has 32-wide, 2-layer, 2-head text and vision towers, ``image_size`` 32,
    ``patch_size`` 8, ``projection_dim`` 32 and 77 text positions: a forward pass on the
    CPU takes milliseconds. ``tmp_dir`` receives ``vocab.json`` and ``merges.txt`` (no
    merges): the 256 byte-level characters, each also in its end-of-word form ``"x</w>"``,
    then ``<|startoftext|>`` (id 512) and ``<|endoftext|>`` (id 513, also padding). So every
    string tokenizes, one token per byte (lowercased first, as CLIP does). Load it with
    ``CLIPTokenizerFast.from_pretrained(tokenizer_dir)``; the config's text ``bos``/``eos``/
    ``pad`` ids match it, so the text tower pools at the end-of-text token.

    The weights are not made here: ``ClipReward(config=..., tokenizer=tokenizer_dir)``
    builds them from a seed. Returns ``(config, tokenizer_dir)``; ``tokenizer_dir`` is
    ``Path(tmp_dir)``, created if missing. Raises ``OSError`` if the files cannot be written.
    """
    from transformers import CLIPConfig

    chars = _byte_alphabet()
    vocab: dict[str, int] = {}
    for token in [*chars, *(c + "</w>" for c in chars), _BOS, _EOS]:
        vocab[token] = len(vocab)
    out = Path(tmp_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    (out / "merges.txt").write_text("#version: 0.2\n", encoding="utf-8")
    tower = {
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
    }
    config = CLIPConfig(
        text_config={
            **tower,
            "vocab_size": len(vocab),
            "max_position_embeddings": 77,
            "bos_token_id": vocab[_BOS],
            "eos_token_id": vocab[_EOS],
            "pad_token_id": vocab[_EOS],
        },
        vision_config={**tower, "image_size": 32, "patch_size": 8},
        projection_dim=32,
    )
    return config, out
