"""Headless Chromium (Debian's package) driven over its DevTools protocol, with aiohttp's websocket client.

No browser download and no driver: the same ``/usr/bin/chromium`` a user runs.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import subprocess
from pathlib import Path
from types import TracebackType
from typing import Any

import aiohttp

CHROMIUM = Path("/usr/bin/chromium")
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--autoplay-policy=no-user-gesture-required",
    "--use-fake-ui-for-media-stream",
    "--use-fake-device-for-media-stream",
]


class Chromium:
    """One headless browser showing ``url``, with ``microphone`` (a WAV file) as its fake microphone."""

    def __init__(self, url: str, *, microphone: Path, profile: Path, size: tuple[int, int] = (1100, 860)) -> None:
        self.url = url
        self.profile = profile
        self.args = [
            str(CHROMIUM),
            *FLAGS,
            f"--use-file-for-fake-audio-capture={microphone}",
            f"--user-data-dir={profile}",
            "--remote-debugging-port=0",
            f"--window-size={size[0]},{size[1]}",
            url,
        ]
        self._proc: subprocess.Popen[bytes] | None = None
        self._http: aiohttp.ClientSession | None = None
        self._ws: aiohttp.ClientWebSocketResponse | None = None
        self._ids = itertools.count(1)

    async def __aenter__(self) -> Chromium:
        self._proc = subprocess.Popen(self.args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        port_file = self.profile / "DevToolsActivePort"
        async with asyncio.timeout(30):
            while not port_file.exists() or not port_file.read_text().strip():
                if self._proc.poll() is not None:
                    raise RuntimeError(f"chromium exited with {self._proc.returncode}")
                await asyncio.sleep(0.1)
            port = int(port_file.read_text().split()[0])
            self._http = aiohttp.ClientSession()
            page = None
            while page is None:
                async with self._http.get(f"http://127.0.0.1:{port}/json/list") as resp:
                    targets = await resp.json()
                page = next((t for t in targets if t.get("type") == "page"), None)
                if page is None:
                    await asyncio.sleep(0.1)
            self._ws = await self._http.ws_connect(page["webSocketDebuggerUrl"], max_msg_size=0)
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._ws is not None:
            await self._ws.close()
        if self._http is not None:
            await self._http.close()
        if self._proc is not None:
            self._proc.terminate()
            try:
                await asyncio.to_thread(self._proc.wait, 10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                await asyncio.to_thread(self._proc.wait, 10)

    async def send(self, method: str, **params: Any) -> dict[str, Any]:
        assert self._ws is not None
        ident = next(self._ids)
        await self._ws.send_str(json.dumps({"id": ident, "method": method, "params": params}))
        while True:  # events interleave with answers: skip them
            message = json.loads((await self._ws.receive()).data)
            if message.get("id") == ident:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                result: dict[str, Any] = message["result"]
                return result

    async def evaluate(self, expression: str, *, gesture: bool = False) -> Any:
        """The value of a JavaScript expression on the page (promises awaited)."""
        result = await self.send(
            "Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True, userGesture=gesture
        )
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression!r} threw: {result['exceptionDetails']}")
        return result["result"].get("value")

    async def wait_for(self, expression: str, timeout: float) -> Any:
        async with asyncio.timeout(timeout):
            while True:
                value = await self.evaluate(expression)
                if value:
                    return value
                await asyncio.sleep(0.2)

    async def screenshot(self, path: Path) -> None:
        shot = await self.send("Page.captureScreenshot", format="png")
        path.write_bytes(base64.b64decode(shot["data"]))
