"""requests glue: :class:`ReloadingAdapter`, an ``HTTPAdapter`` to mount on ``https://`` that presents a
:class:`~tlsreload_plugins.client.identity.ClientIdentity`'s newest certificate and trusts its newest CA bundle.

urllib3 keys its connection pools by SSL context, and a pooled connection keeps the certificate it was made with
(requests#4325). So each generation of the identity gets a urllib3 ``PoolManager`` of its own, made with that
generation's context: new requests go through the newest, and a replaced one is cleared once no request is between
choosing a connection and having it (urllib3 then closes its idle connections at once, and each connection still
carrying a response when that response is done).
"""

from __future__ import annotations

import logging
import threading
import weakref
from typing import Any
from urllib.parse import urlparse

from requests.adapters import HTTPAdapter
from requests.exceptions import InvalidProxyURL
from requests.models import PreparedRequest, Response
from requests.utils import select_proxy
from urllib3 import HTTPConnectionPool, PoolManager

from tlsreload_plugins.client.identity import ClientIdentity, Presented
from tlsreload_plugins.client.pools import Pools

__all__ = ["ReloadingAdapter"]

log = logging.getLogger("tlsreload_plugins.client")


class ReloadingAdapter(HTTPAdapter):
    """An ``HTTPAdapter`` presenting ``identity``'s newest client certificate and trusting its newest CA bundle.

    What requests' ``verify`` and ``cert`` would set comes from the identity: ``verify=False`` is refused, a CA
    bundle path given to requests (``REQUESTS_CA_BUNDLE``, ``verify="..."``) is not used, and ``cert`` is refused.
    Requests through a proxy are refused (the proxy's connections would not present the certificate).

    Args:
        identity: the client certificate, key and CA bundle, kept fresh.
        **options: what ``HTTPAdapter`` takes (``pool_connections``, ``pool_maxsize``, ``max_retries``,
            ``pool_block``).

    Example::

        identity = ClientIdentity("client.crt", "client.key", cafile="ca.crt")
        session = requests.Session()
        session.mount("https://", ReloadingAdapter(identity))
        session.get("https://service.internal/")
    """

    def __init__(self, identity: ClientIdentity, **options: Any) -> None:
        self.identity = identity
        self._manager_options: dict[str, Any] = {}
        self._chosen = threading.local()  # the manager a request of this thread goes through
        # retire_after=None: urllib3 closes a connection still carrying a response when it is done, never under it.
        self._pools: Pools[PoolManager] = Pools(self._make, retire_after=None)
        reference = weakref.ref(self)

        def on_change(presented: Presented) -> None:
            adapter = reference()
            if adapter is not None:
                _clear_all(adapter._pools.renew(presented.generation))

        self._unsubscribe = identity.subscribe(on_change)
        super().__init__(**options)

    def init_poolmanager(self, connections: int, maxsize: int, block: bool = False, **pool_kwargs: Any) -> None:
        """Keep the settings for each generation's ``PoolManager`` (requests calls this from ``__init__``)."""
        self._manager_options = {"num_pools": connections, "maxsize": maxsize, "block": block, **pool_kwargs}

    def _make(self, generation: int) -> PoolManager:
        return PoolManager(ssl_context=self.identity.context, **self._manager_options)

    @property
    def poolmanager(self) -> PoolManager:
        """The ``PoolManager`` of the request this thread is sending (requests reads it there)."""
        chosen: PoolManager | None = getattr(self._chosen, "manager", None)
        if chosen is None:
            raise RuntimeError("ReloadingAdapter chooses a pool manager per request: use send()")
        return chosen

    @poolmanager.setter
    def poolmanager(self, value: PoolManager) -> None:
        raise AttributeError("ReloadingAdapter makes its pool managers from its ClientIdentity")

    def send(
        self,
        request: PreparedRequest,
        stream: bool = False,
        timeout: Any = None,
        verify: Any = True,
        cert: Any = None,
        proxies: Any = None,
    ) -> Response:
        """Send ``request`` through the pool manager of the identity's newest generation."""
        if verify is False:
            raise ValueError("verify=False with a ReloadingAdapter: the ClientIdentity's CA bundle decides trust")
        if cert is not None:
            raise ValueError("cert= with a ReloadingAdapter: the ClientIdentity's certificate is presented")
        if request.url and request.url.lower().startswith("https") and select_proxy(request.url, proxies):
            raise InvalidProxyURL(
                "a ReloadingAdapter does not send through a proxy (its connections present no client certificate)"
            )
        manager, to_clear = self._pools.acquire(self.identity.generation)
        _clear_all(to_clear)
        self._chosen.manager = manager
        try:
            return super().send(request, stream=stream, timeout=timeout, verify=True, cert=None, proxies=proxies)
        finally:
            self._chosen.manager = None
            # Once send() returns, the connection carrying the response is out of the pool: clearing the manager
            # no longer takes it from under the response.
            _clear_all(self._pools.release(manager))

    def get_connection_with_tls_context(
        self, request: PreparedRequest, verify: Any, proxies: Any = None, cert: Any = None
    ) -> HTTPConnectionPool:
        """The pool for ``request`` in this request's pool manager, keyed with certificate verification required
        and nothing else: the manager's context holds the CAs and the certificate (requests would add a CA path
        or its own preloaded context, which urllib3 would load into, or put in place of, this one)."""
        url = urlparse(str(request.url))
        return self.poolmanager.connection_from_host(
            host=url.hostname, port=url.port, scheme=url.scheme.lower(), pool_kwargs={"cert_reqs": "CERT_REQUIRED"}
        )

    def cert_verify(self, conn: Any, url: str, verify: Any, cert: Any) -> None:
        """Certificates are verified against the context's CAs: no CA path on the pool (urllib3 would load it
        into the context) and no certificate file."""
        if url.lower().startswith("https"):
            conn.cert_reqs = "CERT_REQUIRED"
            conn.ca_certs = None
            conn.ca_cert_dir = None
            return
        super().cert_verify(conn, url, verify, cert)

    def close(self) -> None:
        self._unsubscribe()
        _clear_all(self._pools.close())
        for proxy in self.proxy_manager.values():
            proxy.clear()


def _clear_all(managers: list[PoolManager]) -> None:
    for manager in managers:
        manager.clear()
