"""An engine URL whose host or port does not parse is a ConfigError naming it when the
router is made, in Python as on the command line (``http://::zz`` was a ValueError out of
a task group)."""

from __future__ import annotations

import pytest

from miles_lite.engine.balancer import check_engine_url
from miles_lite.engine.config import RouterConfig
from miles_lite.engine.http.client import EngineClient
from miles_lite.engine.router import Router
from miles_lite.errors import ConfigError


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("http://::zz", "Port could not be cast to integer value as ':zz'"),
        ("http://[::zz]:1", "'::zz' does not appear to be an IPv4 or IPv6 address"),
        ("http://h:99999", "Port out of range 0-65535"),
        ("http://h:port", "Port could not be cast to integer value as 'port'"),
    ],
)
def test_a_host_or_port_that_does_not_parse_is_named(url: str, why: str) -> None:
    with pytest.raises(ConfigError) as caught:
        check_engine_url(url)
    assert str(caught.value) == (
        f"engine URL {url!r}: the host and port do not parse ({why}); write http://host:port"
        " (an IPv6 host in brackets: http://[::1]:30000)"
    )


@pytest.mark.parametrize("url", ["http://[::1]:30000", "https://engine-0:443", "http://h"])
def test_urls_that_parse_pass(url: str) -> None:
    check_engine_url(url)


@pytest.mark.anyio
async def test_the_router_refuses_it_when_made() -> None:
    async with EngineClient() as client:
        with pytest.raises(ConfigError, match=r"engine URL 'http://::zz': the host and port"):
            Router(["http://::zz"], client, RouterConfig(max_inflight_per_engine=1))
