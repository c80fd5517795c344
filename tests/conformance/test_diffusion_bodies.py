"""Diffusion bodies built by SGLang's own /rollout/generate response builder, served from
loopback and read by DiffusionRollout in every transport mode: every tensor's shape, dtype
and bytes, and the non-tensor fields, come through intact."""

from __future__ import annotations

import hashlib
import json
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import torch
from aiohttp import web

from miles_lite.diffusion.config import DiffusionRolloutConfig
from miles_lite.diffusion.rollout import DiffusionRollout
from miles_lite.types import Sample, SampleStatus

pytestmark = pytest.mark.anyio

SCRIPT = (
    Path(__file__).resolve().parents[2] / "scripts" / "sglang-cpu" / "build_diffusion_bodies.py"
)


@pytest.fixture(scope="session")
def bodies(sglang_python: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("sglang-diffusion-bodies")
    done = subprocess.run(
        [str(sglang_python), str(SCRIPT), str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if done.returncode != 0:
        pytest.fail(f"building bodies with SGLang failed:\n{done.stderr[-3000:]}")
    return out


class BodyServer:
    """Answers POST /rollout/generate with the body of the current case."""

    def __init__(self) -> None:
        self.body = b""
        self.requests: list[dict[str, Any]] = []
        self.url = ""

    async def generate(self, request: web.Request) -> web.Response:
        self.requests.append(await request.json())
        return web.Response(body=self.body, content_type="application/msgpack")

    async def health(self, request: web.Request) -> web.Response:
        return web.Response()


@pytest.fixture
async def body_server() -> AsyncIterator[BodyServer]:
    server = BodyServer()
    app = web.Application()
    app.router.add_post("/rollout/generate", server.generate)
    app.router.add_get("/health", server.health)
    app.router.add_get("/health_generate", server.health)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    server.url = f"http://127.0.0.1:{port}"
    try:
        yield server
    finally:
        await runner.cleanup()


def sha(t: torch.Tensor) -> str:
    return hashlib.sha256(
        t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
    ).hexdigest()


def lookup(sample: Sample, path: str) -> Any:
    head, *rest = path.split(".")
    value: Any
    if head == "dit_trajectory":
        assert sample.dit_trajectory is not None, path
        value = getattr(sample.dit_trajectory, rest.pop(0))
    else:
        value = getattr(sample, head)
    for key in rest:
        assert isinstance(value, dict), (path, type(value))
        value = value[key]
    return value


MODES = {
    "pool": {"transport": "pool"},
    "inline": {"transport": "inline"},
    "fetch_in_parser": {"transport": "pool", "fetch_in_parser": True},
}


@pytest.mark.parametrize("mode", list(MODES))
async def test_sglang_built_bodies_decode_intact(
    mode: str, bodies: Path, body_server: BodyServer
) -> None:
    manifest = json.loads((bodies / "manifest.json").read_text())
    config = DiffusionRolloutConfig(n_samples_per_prompt=2, microgroup_size=2, **MODES[mode])
    checked = 0
    async with DiffusionRollout.open([body_server.url], config=config) as rollout:
        for name, case in manifest.items():
            body_server.body = (bodies / f"{name}.msgpack").read_bytes()
            result = await rollout.run([case["prompt"]])
            samples = result.samples
            assert len(samples) == case["batch"], name
            for i, sample in enumerate(samples):
                assert sample.status is SampleStatus.COMPLETED, (name, sample.error)
                assert sample.request_id == case["request_id"]
                assert sample.inference_time_s == case["inference_time_s"]
                assert sample.peak_memory_mb == case["peak_memory_mb"]
                for path, want in case["tensors"].items():
                    index, field = path.split(".", 1)
                    if int(index) != i:
                        continue
                    got = lookup(sample, field)
                    assert isinstance(got, torch.Tensor), (name, path, type(got))
                    assert list(got.shape) == want["shape"], (name, path)
                    assert str(got.dtype) == want["dtype"], (name, path)
                    assert sha(got) == want["sha256"], (name, path, "bytes differ")
                    checked += 1
                if case["rollout"]:
                    assert sample.denoising_env is not None
                    for side in ("pos_cond_kwargs", "neg_cond_kwargs"):
                        assert sample.denoising_env[side]["txt_seq_lens"] == case["txt_seq_lens"]
                else:
                    assert sample.rollout_debug_tensors is None
                    assert sample.denoising_env is None
                    assert sample.dit_trajectory is None
    assert checked == sum(len(c["tensors"]) for c in manifest.values())
    assert all(r["prompt"] for r in body_server.requests)
