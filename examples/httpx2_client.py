"""A service calling an mTLS server with httpx2 (pydantic's fork of httpx), its client certificate rotating under it.

The program is examples/httpx_client.py's, with the same arguments and output, run on httpx2's glue: what differs
for a user moving from httpx to httpx2 is the import, ``from tlsreload_plugins.client.httpx2 import
reloading_client``, and the client it returns, an ``httpx2.Client``.

    python examples/httpx2_client.py --cert client.crt --key client.key --cacert ca.crt \\
        --url https://localhost:8443/ --duration 60 --every 200

Prints one JSON line per request: {"t": ..., "ok": true, "peer": "<the answer>"} or "ok": false with "error".
"""

from __future__ import annotations

import sys

from httpx_client import options, run

from tlsreload_plugins.client.httpx2 import reloading_client

if __name__ == "__main__":
    sys.exit(run(options(__doc__ or ""), reloading_client))
