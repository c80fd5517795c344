from pathlib import Path

import anyio
import pytest


@pytest.mark.anyio
async def test_guard_lets_a_well_behaved_test_pass() -> None:
    await anyio.sleep(0.01)


def test_guard_fails_a_test_that_blocks_the_loop(pytester: pytest.Pytester) -> None:
    pytester.makeconftest((Path(__file__).parent / "conftest.py").read_text())
    pytester.makepyfile(
        """
        import time, pytest
        @pytest.mark.anyio
        async def test_blocks():
            time.sleep(0.4)
        """
    )
    result = pytester.runpytest("-p", "anyio")
    outcomes = result.parseoutcomes()
    assert outcomes.get("errors", 0) + outcomes.get("failed", 0) == 1, outcomes
    assert "event loop was blocked" in result.stdout.str() + result.stderr.str()
