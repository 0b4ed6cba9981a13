"""websockets glue: ``async with reloading(certfile, keyfile) as context`` around ``serve(..., ssl=context)``.

How it is configured: ``websockets.asyncio.server.serve(handler, host, port, ssl=...)`` takes an
:class:`ssl.SSLContext` and hands it to asyncio's ``create_server`` once. :func:`reloading` gives it
one from :func:`~tlsreload_plugins.fresh_context`, made in the loop's executor (reading and validating
the files never runs on the event loop), checked in a daemon thread while the ``async with`` block runs,
and stopped when it ends.

What a reload changes: every new connection (a websocket's opening handshake, or a plain HTTP request
answered by ``process_request``) gets the newest valid certificate; an open websocket keeps its TLS
session, certificate and keys, for as long as it stays open. A torn, mismatched or expired pair is
reported once and the last good one keeps serving.

Worker lifecycle: one process, one event loop; nothing here imports websockets, and the same block
serves any asyncio server that takes an ``ssl=`` context (``loop.create_server``, aiohttp's ``TCPSite``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import ssl
from collections.abc import AsyncIterator, Callable, Iterable

from tlsreload_plugins.authorization import Authorizer
from tlsreload_plugins.fresh import fresh_context, reloaders
from tlsreload_plugins.memory_files import RecipeFor
from tlsreload_plugins.renamed import renamed

__all__ = ["reloaders", "reloading"]

log: logging.Logger = logging.getLogger("tlsreload_plugins.websockets")


@contextlib.asynccontextmanager
async def reloading(
    certfile: str,
    keyfile: str | None = None,
    *,
    ca_certs: str | None = None,
    crl: str | None = None,
    password_file: str | None = None,
    sni: Iterable[str] | str | None = None,
    interval: float | None = None,
    recipe: RecipeFor | None = None,
    metrics: bool | None = None,
    authorize: Authorizer | Callable[[str], bool] | str | None = None,
) -> AsyncIterator[ssl.SSLContext]:
    """An :class:`ssl.SSLContext` that follows the certificate files while the ``async with`` block runs.

    Args:
        certfile, keyfile, ca_certs, crl, password_file, sni, interval, recipe, metrics: as
            :func:`~tlsreload_plugins.fresh_context` (``ca_certs`` means mutual TLS: client certificates
            are required and verified against that bundle, reloaded like the pair).
        authorize: who may connect, by SPIFFE ID (else ``$TLSRELOAD_SPIFFE_AUTHORIZE``): as ``fresh_context``.

    Yields:
        The context to give the server once (``serve(..., ssl=context)``); it keeps serving the last
        certificate it served after the block, unchecked.

    Raises:
        InvalidIdentity: the files cannot be used now; one sentence names the file and what is wrong.
        ValueError: a setting is not usable (see :func:`~tlsreload_plugins.fresh_context`).

    Example::

        async with reloading("/etc/tls/tls.crt", "/etc/tls/tls.key") as ssl_context:
            async with serve(handler, "0.0.0.0", 8443, ssl=ssl_context) as server:
                await server.serve_forever()
    """
    loop = asyncio.get_running_loop()
    make = functools.partial(
        fresh_context,
        certfile,
        keyfile,
        ca_certs=ca_certs,
        crl=crl,
        password_file=password_file,
        sni=sni,
        interval=interval,
        recipe=recipe,
        metrics=metrics,
        authorize=authorize,
    )
    fresh = await loop.run_in_executor(None, make)
    try:
        yield fresh.context
    finally:
        # close() joins the checking thread, which may be in the middle of a check: not on the loop.
        await loop.run_in_executor(None, fresh.close)
        log.debug("stopped checking %s", fresh.reloader.files.describe())


reloading_ssl: Callable[..., contextlib.AbstractAsyncContextManager[ssl.SSLContext]] = renamed(
    reloading, "reloading_ssl", "tlsreload_plugins.websockets"
)
"""Deprecated: :func:`reloading` (the name of an earlier release, for one more; it warns)."""
