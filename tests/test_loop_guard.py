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
            start = time.thread_time()
            while time.thread_time() - start < 0.6:  # a CPU-bound stall of the loop
                pass
        """
    )
    result = pytester.runpytest("-p", "anyio")
    outcomes = result.parseoutcomes()
    assert outcomes.get("errors", 0) + outcomes.get("failed", 0) == 1, outcomes
    assert "event loop was blocked" in result.stdout.str() + result.stderr.str()


def test_guard_ignores_time_other_processes_take(pytester: pytest.Pytester) -> None:
    # A step that waits (here: sleeps, as it would for a core another process holds)
    # spends no CPU of its own: the guard measures what the code did, not the machine.
    pytester.makeconftest((Path(__file__).parent / "conftest.py").read_text())
    pytester.makepyfile(
        """
        import time, pytest
        @pytest.mark.anyio
        async def test_waits():
            time.sleep(0.6)  # not library code: blockbuster leaves it alone
        """
    )
    result = pytester.runpytest("-p", "anyio")
    assert result.parseoutcomes().get("passed") == 1, result.stdout.str()


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_guard_catches_a_short_blocking_call_of_the_library_on_both_loops(
    pytester: pytest.Pytester, loop: str
) -> None:
    # Writing a trace (a file) on the loop by mistake: a blocking write of the library on the
    # loop's thread, however short it is.
    pytester.makeconftest((Path(__file__).parent / "conftest.py").read_text())
    pytester.makepyfile(
        f"""
        import pytest
        from miles_lite.rollout.result import RolloutResult
        from miles_lite.rollout.trace import write_trace

        @pytest.fixture
        def anyio_backend():
            return ("asyncio", {{"use_uvloop": {loop == "uvloop"}}})

        @pytest.mark.anyio
        async def test_blocks():
            write_trace(RolloutResult(groups=[]), "trace.json")
        """
    )
    # In a subprocess: the inner run imports torch and numpy, which cannot be imported twice
    # in one process (an in-process pytester run drops and re-imports what it loaded).
    result = pytester.runpytest_subprocess("-p", "anyio")
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed", 0) == 1, outcomes
    assert "BlockingError" in result.stdout.str()
