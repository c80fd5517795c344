"""The chaos tier: a text rollout over two REAL SGLang 0.5.23 CPU servers whose fleet
changes under it (issue 33): killed, stopped, added, removed, killed mid-update.

Run with ``python -m pytest tests/chaos -m chaos -p no:cacheprovider`` after
``scripts/sglang-cpu/setup.sh`` (venv: ``$MILES_LITE_SGLANG_VENV`` or ``.sglang-venv``).
A plain ``python -m pytest`` deselects it. The two servers start once per module (each in
its own process group, with ``--sleep-on-idle``); a case that kills one restarts it on its
port with its launch weights. Each server logs every request it receives and finishes
(``--log-requests --log-requests-format json``): the tier reads which rids each engine
got and the weight version each was served with from the servers' own logs.
"""

from __future__ import annotations

import concurrent.futures
import copy
import json
import os
import signal
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch

from miles_lite import TextRollout, TextRolloutConfig, TextSamplingParams
from miles_lite.engine.config import EngineClientConfig, EngineConfig, RetryPolicy, RouterConfig
from miles_lite.rollout.result import RolloutResult
from miles_lite.testing import SGLangServer, SGLangServerConfig, default_sglang_venv
from miles_lite.testing.sglang_server import shm_leftovers, shm_names
from tests.conftest import separate_tier

HERE = Path(__file__).resolve().parent
#: Per-test limit (the first test of a module also waits for two server starts).
TEST_TIMEOUT_S = 480
#: Log-probs re-scored by transformers against the weights of their version: measured
#: 9.5e-7 at most in the conformance tier (float32 on this CPU).
LOGPROB_TOLERANCE = 1e-4
#: Each server's own request log, one JSON line a request received and finished.
REQUEST_LOG = ("--log-requests", "--log-requests-format", "json", "--log-requests-level", "0")

#: What SGLang logs once its warmup request is done.
FIRED_UP = "The server is fired up and ready to roll"
#: The rid prefix of /health's own generations (SGLang's HEALTH_CHECK_RID_PREFIX).
HEALTH_CHECK = "HEALTH_CHECK"
#: Probes every 500 ms; one failed probe or request takes an engine out. SGLang's
#: /health generates a token and waits at least 1 s for it: a probe gets 3 s.
CHAOS_ROUTER = RouterConfig(
    max_inflight_per_engine=4,
    health_interval_s=0.5,
    health_timeout_s=3.0,
    failure_threshold=1,
    readmit_cooldown_s=0.2,
    wait_timeout_s=120.0,
)
SAMPLING = TextSamplingParams(max_new_tokens=32, extra={"ignore_eos": True})


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "chaos: two real CPU SGLang servers whose fleet changes under a rollout"
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    separate_tier(config, items, HERE, "chaos", TEST_TIMEOUT_S)
    for item in items:
        if HERE in Path(str(item.path)).parents:
            # Two real servers share the 2 cores with the test: a loop step can wait for
            # a core without the library doing anything wrong (blocking calls still fail).
            item.add_marker(pytest.mark.slow_steps_ok)


@dataclass
class Fleet:
    """The two servers, restartable on their ports, and the weights each version names."""

    venv: Path
    servers: list[SGLangServer]
    #: version -> the transformers model of its weights.
    models: dict[str, Any] = field(default_factory=dict)
    #: Request-log lines of lives that ended, by port.
    old_logs: dict[int, list[str]] = field(default_factory=dict)

    @property
    def urls(self) -> list[str]:
        return [s.url for s in self.servers]

    def port(self, i: int) -> int:
        return int(self.servers[i].url.rsplit(":", 1)[1])

    def kill(self, i: int) -> None:
        """SIGKILL server ``i``'s whole process group (no goodbye)."""
        server = self.servers[i]
        assert server.pid is not None
        port = self.port(i)
        self.old_logs.setdefault(port, []).extend(log_lines(server))
        os.killpg(server.pid, signal.SIGKILL)

    def restart(self, i: int) -> SGLangServer:
        """Start server ``i`` again on its port, with its launch weights."""
        port = self.port(i)
        self.servers[i].stop()  # reaps the killed tree and its shared memory
        server = new_server(self.venv, port)
        server.start()
        self.servers[i] = server
        return server

    def received(self, i: int) -> list[str]:
        """The rids server ``i`` received in its current life, in order."""
        return [e["rid"] for e in events(self.servers[i]) if e["event"] == "request.received"]

    def served(self, i: int) -> dict[str, str]:
        """rid -> the weight version server ``i`` finished it with (current life)."""
        return {
            e["rid"]: str(e["out"]["meta_info"].get("weight_version"))
            for e in events(self.servers[i])
            if e["event"] == "request.finished"
        }


def new_server(venv: Path, port: int = 0) -> SGLangServer:
    return SGLangServer(
        SGLangServerConfig(
            venv=venv, port=port, start_timeout_s=TEST_TIMEOUT_S - 60, extra_args=REQUEST_LOG
        )
    )


def log_lines(server: SGLangServer) -> list[str]:
    if server.log_path is None or not server.log_path.exists():
        return []
    return server.log_path.read_text(errors="replace").splitlines()


def events(server: SGLangServer) -> list[dict[str, Any]]:
    """The JSON request events of the server's log once it is up, less /health's own
    one-token generations. SGLang warms itself up with one ``/generate`` of its own
    before it logs ``fired up``: that one is skipped (and checked to be alone)."""
    out: list[dict[str, Any]] = []
    warmup: set[str] = set()
    up = False
    for line in log_lines(server):
        if FIRED_UP in line:
            up = True
        start = line.find('{"timestamp"')
        if start < 0:
            continue
        try:
            event = json.loads(line[start:])
        except json.JSONDecodeError:
            continue
        rid = str(event.get("rid"))
        if rid.startswith(HEALTH_CHECK):
            continue
        if not up:
            warmup.add(rid)
            continue
        out.append(event)
    assert len(warmup) <= 1, f"requests before the server was up: {sorted(warmup)}"
    return out


@pytest.fixture(scope="module")
def fleet() -> Iterator[Fleet]:
    """Two real servers for a module, started side by side, stopped with their trees."""
    venv = default_sglang_venv()
    if not (venv / "bin" / "python").exists():
        pytest.fail(f"no SGLang venv at {venv}: run scripts/sglang-cpu/setup.sh first")
    before = shm_names()
    servers = [new_server(venv), new_server(venv)]
    try:
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            for future in [pool.submit(s.start) for s in servers]:
                future.result()
    except Exception as exc:
        for s in servers:
            s.stop()
        pytest.fail(f"the SGLang servers did not start: {exc}")
    from transformers import Qwen2ForCausalLM

    base = Qwen2ForCausalLM.from_pretrained(str(servers[0].config.model)).train(False)
    fleet = Fleet(venv=venv, servers=servers, models={"default": base})
    try:
        yield fleet
    finally:
        for s in fleet.servers:
            s.stop()
    # Killed servers too (their resource trackers died with them): nothing left behind.
    left = shm_leftovers(before)
    assert not left, f"the servers left shared memory behind: {left}"


@asynccontextmanager
async def chaos_rollout(
    fleet: Fleet,
    tokenizer: Any,
    *,
    urls: list[str] | None = None,
    read_timeout_s: float = 60.0,
    **config: Any,
) -> AsyncIterator[TextRollout]:
    """A text rollout over ``urls`` (default: the fleet's servers; CHAOS_ROUTER, one try a
    request)."""
    config.setdefault("sampling", SAMPLING)
    settings = TextRolloutConfig(
        engines=EngineConfig(
            router=config.pop("router", CHAOS_ROUTER),
            client=EngineClientConfig(
                retry=RetryPolicy(max_attempts=1), read_timeout_s=read_timeout_s
            ),
        ),
        **config,
    )
    async with TextRollout.open(
        urls or fleet.urls, tokenizer=tokenizer, config=settings
    ) as rollout:
        yield rollout


def perturbed(model: Any, folder: Path, seed: int) -> Any:
    """A copy of ``model`` with other embeddings, saved to ``folder``."""
    new = copy.deepcopy(model)
    with torch.no_grad():
        weight = new.model.embed_tokens.weight
        weight.add_(0.05 * torch.randn(weight.shape, generator=torch.Generator().manual_seed(seed)))
    new.save_pretrained(str(folder))
    return new


def no_rid_reached_two(*rid_lists: list[str]) -> None:
    """No rid reached two engines, nor one engine twice (a generation is never re-sent)."""
    seen: set[str] = set()
    for rids in rid_lists:
        assert len(rids) == len(set(rids)), "a rid reached one engine twice"
        assert not seen & set(rids), f"rids at two engines: {sorted(seen & set(rids))}"
        seen |= set(rids)


def rescore(models: dict[str, Any], result: RolloutResult) -> float:
    """Every response token's log-prob against a transformers forward of the weights of
    its span's version; returns the worst difference (asserted under the tolerance)."""
    worst = 0.0
    for sample in result.samples:
        if not sample.response_length or sample.rollout_log_probs is None:
            continue
        prompt = len(sample.tokens) - sample.response_length
        for span in sample.weight_spans:
            model = models[span.version]
            with torch.inference_mode():
                logits = model(input_ids=torch.tensor([sample.tokens])).logits[0].float()
                all_lp = torch.log_softmax(logits, dim=-1)
            for i in range(span.start, span.end):
                want = float(all_lp[prompt - 1 + i, sample.tokens[prompt + i]])
                worst = max(worst, abs(want - sample.rollout_log_probs[i]))
    assert worst < LOGPROB_TOLERANCE, worst
    return worst
