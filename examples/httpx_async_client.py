"""A service calling an mTLS server with ``httpx.AsyncClient``, its client certificate rotating under it.

One ``httpx.AsyncClient`` for the whole run; the files are checked in a thread, never on the event loop.

    python examples/httpx_async_client.py --cert client.crt --key client.key --cacert ca.crt \\
        --url https://localhost:8443/ --duration 60 --every 200

Prints one JSON line per request: {"t": ..., "ok": true, "peer": "<the answer>"} or "ok": false with "error".
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import sys
import time
from collections.abc import Callable
from typing import Any

from httpx_client import options

from tlsreload_plugins.client import ClientIdentity


async def run(args: argparse.Namespace, async_reloading_client: Callable[..., Any]) -> None:
    """GET ``args.url`` every ``args.every`` ms through one client made by ``async_reloading_client`` (httpx's glue,
    or httpx2's)."""
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    identity = ClientIdentity(args.cert, args.key, cafile=args.cacert, interval=args.interval)
    with identity:
        async with async_reloading_client(identity, timeout=5.0) as client:
            end = time.monotonic() + args.duration
            while not stop.is_set() and time.monotonic() < end:
                line: dict[str, object] = {"t": time.time()}
                try:
                    response = await client.get(args.url)
                    response.raise_for_status()
                    line.update(ok=True, peer=response.text.strip())
                except Exception as e:
                    line.update(ok=False, error=repr(e))
                print(json.dumps(line), flush=True)
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(stop.wait(), args.every / 1000)


def main() -> int:
    from tlsreload_plugins.client.httpx import async_reloading_client  # here: httpx2_async_client.py needs no httpx

    asyncio.run(run(options(__doc__ or ""), async_reloading_client))
    return 0


if __name__ == "__main__":
    sys.exit(main())
