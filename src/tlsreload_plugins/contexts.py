"""A plain server context, built the way most servers build theirs from their settings.

For glue whose server has no setting for the key's password (its own factory loads the key without
one, and OpenSSL would then prompt on a terminal): the same steps, with the password. Nothing here
knows a server.
"""

from __future__ import annotations

import ssl
from collections.abc import Sequence

from .files import Password, TLSFiles

__all__ = ["server_context"]


def server_context(
    files: TLSFiles,
    password: Password = None,
    *,
    verify_mode: ssl.VerifyMode | int | None = None,
    ciphers: str | None = None,
    alpn: Sequence[str] | None = None,
) -> ssl.SSLContext:
    """``ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=files.ca_certs)`` holding the chain and key
    of ``files`` (the key opened with ``password``), then ``verify_mode``, ``ciphers`` and the ``alpn``
    protocols, each where given.

    Raises:
        ssl.SSLError, OSError, ValueError: as :meth:`ssl.SSLContext.load_cert_chain` and the setters raise them.

    Example: ``server_context(files, password, verify_mode=ssl.CERT_REQUIRED, alpn=["h2", "http/1.1"])``.
    """
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=files.ca_certs)
    context.load_cert_chain(files.certfile, files.keyfile, password)
    if verify_mode is not None:
        context.verify_mode = ssl.VerifyMode(verify_mode)
    if ciphers:
        context.set_ciphers(ciphers)
    if alpn:
        context.set_alpn_protocols(alpn)
    return context
