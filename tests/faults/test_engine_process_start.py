"""A stand-in engine process that fails to start reports why; stopping it hides nothing."""

from __future__ import annotations

import socket

import pytest

from miles_lite.errors import EngineUnavailableError
from miles_lite.testing import EngineProcess, StandInConfig


def test_stop_after_a_failed_start_raises_nothing_and_the_start_error_stays() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        process = EngineProcess(StandInConfig(port=port), start_timeout_s=30)
        with pytest.raises(EngineUnavailableError, match="exited with code 1 before serving"):
            process.start()
        process.stop()  # no AssertionError hiding the start error
        process.stop()  # idempotent
        with (
            pytest.raises(EngineUnavailableError, match="before serving"),
            EngineProcess(StandInConfig(port=port), start_timeout_s=30),
        ):
            pass
