"""The fast tier (issue 34.7): tests/conftest.py marks ``slow`` what starts processes or
servers, read from a test module's source, the test's own calls and its fixtures. (This
module names them, so it is itself in the slow tier.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import SLOW_CALLS, SLOW_FIXTURES, SLOW_TIERS, starts_processes

TESTS = Path(__file__).resolve().parent


@pytest.mark.parametrize(
    "module",
    [
        "pools/test_dask_pool.py",  # a LocalCluster
        "pools/test_dask_scheduler_loss.py",  # scheduler and worker processes
        "faults/test_pool_faults.py",  # RewardPool worker processes
        "engine/test_transport_contract.py",  # a ParserPool
        "testing/test_engine_process.py",  # stand-in engines in child processes
        "rewards/test_math_rewards.py",  # reward pools
        "training/test_trust.py",  # a journal's writer process
        "training/test_sample_rows.py",  # the same, through a rollout's journal=
    ],
)
def test_modules_that_start_processes_are_slow(module: str) -> None:
    assert starts_processes(TESTS / module, {})


@pytest.mark.parametrize(
    "module",
    [
        "engine/test_retry.py",
        "engine/test_mock_transport.py",
        "rewards/test_reward_values.py",
        "training/test_stream.py",
    ],
)
def test_modules_on_one_event_loop_are_fast(module: str) -> None:
    assert not starts_processes(TESTS / module, {})


def test_the_cli_and_readme_snippets_are_slow_calls_and_tiers_are_slow() -> None:
    assert SLOW_CALLS.search('    run = cli("diffusion", "--engine-url", url)')
    assert SLOW_CALLS.search("    code = pointed(block('In a script'))")
    assert not SLOW_CALLS.search("    client = EngineClient(config)")
    assert {tier.name for tier in SLOW_TIERS} == {"conformance", "chaos", "smg", "peer"}
    assert "reward_pools" in SLOW_FIXTURES
    assert "journaled" in SLOW_FIXTURES  # a rollout with a journal: its writer process
