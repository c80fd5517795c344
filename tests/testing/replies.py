"""Plain aiohttp requests to a stand-in engine, read whole."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import aiohttp


@dataclass
class Reply:
    """What a request got back."""

    status: int
    content_type: str
    body: bytes

    def json(self) -> Any:
        """The body decoded as JSON."""
        return json.loads(self.body)


async def post(
    session: aiohttp.ClientSession, url: str, body: Any, path: str = "/rollout/generate"
) -> Reply:
    """POST ``body`` as JSON and read the whole answer."""
    async with session.post(url + path, json=body) as response:
        return Reply(response.status, response.content_type, await response.read())


async def post_raw(session: aiohttp.ClientSession, url: str, data: bytes) -> Reply:
    """POST raw bytes to ``/rollout/generate`` and read the whole answer."""
    headers = {"Content-Type": "application/json"}
    async with session.post(url + "/rollout/generate", data=data, headers=headers) as response:
        return Reply(response.status, response.content_type, await response.read())


async def get(session: aiohttp.ClientSession, url: str, path: str) -> Reply:
    """GET ``path`` and read the whole answer."""
    async with session.get(url + path) as response:
        return Reply(response.status, response.content_type, await response.read())
