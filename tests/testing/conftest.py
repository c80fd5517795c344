"""Fixtures of the stand-in engine tests: a plain aiohttp client."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import pytest


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    """One aiohttp session for the test, with a bound on every request."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as client:
        yield client
