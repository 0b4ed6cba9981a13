"""A service calling an mTLS server with ``httpx2.AsyncClient``, its client certificate rotating under it.

examples/httpx_async_client.py's program, arguments and output, run on httpx2's glue (``from
tlsreload_plugins.client.httpx2 import async_reloading_client``): see examples/httpx2_client.py.

    python examples/httpx2_async_client.py --cert client.crt --key client.key --cacert ca.crt \\
        --url https://localhost:8443/ --duration 60 --every 200
"""

from __future__ import annotations

import asyncio
import sys

from httpx_async_client import run
from httpx_client import options

from tlsreload_plugins.client.httpx2 import async_reloading_client

if __name__ == "__main__":
    asyncio.run(run(options(__doc__ or ""), async_reloading_client))
    sys.exit(0)
