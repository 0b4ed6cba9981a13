"""requests glue: :class:`ReloadingAdapter`, an ``HTTPAdapter`` to mount on ``https://`` that presents a
:class:`~tlsreload_plugins.client.identity.ClientIdentity`'s newest certificate and trusts its newest CA bundle.

urllib3 keys its connection pools by SSL context, and a pooled connection keeps the certificate it was made with
(requests#4325). So each generation of the identity gets urllib3 managers of its own, made with that generation's
context: a ``PoolManager`` for direct requests and, made on first use, a ``ProxyManager`` (or ``SOCKSProxyManager``)
per proxy URL, whose tunnelled connections do their TLS with that context too. New requests go through the newest
generation's managers, and a replaced generation's are cleared together once no request is between choosing a
connection and having it (urllib3 then closes their idle connections at once, and each connection still carrying a
response when that response is done).
"""

from __future__ import annotations

import ipaddress
import logging
import ssl
import threading
import types
import weakref
from collections.abc import Callable
from typing import Any
from urllib.parse import urlparse

import urllib3
from requests.adapters import HTTPAdapter
from requests.exceptions import InvalidProxyURL, InvalidSchema, InvalidURL, ProxyError
from requests.models import PreparedRequest, Response
from requests.utils import get_auth_from_url, prepend_scheme_if_needed, select_proxy
from urllib3 import HTTPConnectionPool, PoolManager
from urllib3.poolmanager import proxy_from_url
from urllib3.util import parse_url

from tlsreload_plugins.client.identity import ClientIdentity, Presented
from tlsreload_plugins.client.pools import Pools

try:  # as requests imports it: SOCKS proxies need PySocks
    from urllib3.contrib.socks import SOCKSProxyManager
except ImportError:  # pragma: no cover - depends on what is installed
    SOCKSProxyManager = None  # type: ignore[assignment,misc]

__all__ = ["ReloadingAdapter"]

log: logging.Logger = logging.getLogger("tlsreload_plugins.client")

_URLLIB3_1 = str(getattr(urllib3, "__version__", "")).startswith("1.")

# A proxy manager is kept per proxy URL and, for an HTTPS proxy, per CA locations trusted for the proxy itself.
_ProxyKey = tuple[str, "str | None", "str | None"]


class _Managers:
    """One generation's urllib3 managers, all made with its context: the direct ``PoolManager`` and one proxy
    manager per proxy (made on first use). Retired and cleared together."""

    def __init__(self, context: ssl.SSLContext, options: dict[str, Any]) -> None:
        self.context = context
        self.direct = PoolManager(ssl_context=context, **options)
        self.cleared = False
        self._proxied: dict[_ProxyKey, PoolManager] = {}
        self._lock = threading.Lock()

    def through(self, key: _ProxyKey, make: Callable[[], PoolManager]) -> PoolManager:
        """The proxy manager for ``key``, made by ``make`` the first time (under the lock: two requests racing
        for a new proxy share one manager, as they share one pool)."""
        with self._lock:
            manager = self._proxied.get(key)
            if manager is None:
                manager = self._proxied[key] = make()
            return manager

    def clear(self) -> None:
        """Close the idle connections of every manager (``PoolManager.clear``); lent ones close when returned."""
        self.cleared = True
        self.direct.clear()
        with self._lock:
            proxied = list(self._proxied.values())
        for manager in proxied:
            manager.clear()


class ReloadingAdapter(HTTPAdapter):
    """An ``HTTPAdapter`` presenting ``identity``'s newest client certificate and trusting its newest CA bundle.

    What requests' ``verify`` and ``cert`` would set for the server comes from the identity: ``verify=False`` is
    refused, a CA bundle path given to requests (``REQUESTS_CA_BUNDLE``, ``verify="..."``) does not decide trust in
    the server, and ``cert`` is refused.

    Proxies are used as requests alone uses them: the ``proxies`` requests hands the adapter (a session's
    ``proxies``, a request's ``proxies=``, and with ``trust_env`` the environment's ``HTTPS_PROXY``, ``ALL_PROXY``
    and ``NO_PROXY``), chosen by requests' ``select_proxy``, ``Proxy-Authorization`` from the proxy URL's
    credentials (``proxy_headers``). An HTTPS request goes through a CONNECT tunnel (SOCKS: with PySocks
    installed) and the certificate is presented to the server inside it. Trust in an HTTPS proxy itself is what
    requests alone would give it: ``verify``'s CA bundle (requests' default bundle when ``verify`` is ``True``).

    :meth:`close` (``Session.close``) closes every pooled connection and, as with requests alone, the adapter can
    still be used afterwards; it keeps following the identity until it is garbage collected.

    Args:
        identity: the client certificate, key and CA bundle, kept fresh.
        **options: what ``HTTPAdapter`` takes (``pool_connections``, ``pool_maxsize``, ``max_retries``,
            ``pool_block``).

    Raises:
        ValueError: from :meth:`send`, for ``verify=False`` or ``cert=``.

    Example::

        identity = ClientIdentity("client.crt", "client.key", cafile="ca.crt")
        session = requests.Session()
        session.mount("https://", ReloadingAdapter(identity))
        session.get("https://service.internal/")  # through $HTTPS_PROXY if set, as with requests alone
    """

    def __init__(self, identity: ClientIdentity, **options: Any) -> None:
        self.identity = identity
        self._own = identity.own_context()  # urllib3 sets its ALPN list on the context: never another client's
        self._manager_options: dict[str, Any] = {}
        self._chosen = threading.local()  # the managers (and verify) of the request this thread is sending
        # retire_after=None: urllib3 closes a connection still carrying a response when it is done, never under it.
        self._pools: Pools[_Managers] = Pools(self._make, retire_after=None)
        reference = weakref.ref(self)

        def on_change(presented: Presented) -> None:
            adapter = reference()
            if adapter is not None:
                _clear_all(adapter._pools.renew(presented.generation))

        # close() no longer ends the subscription (the adapter works on after it): it ends with the adapter.
        self._unsubscribe = weakref.finalize(self, identity.subscribe(on_change))
        super().__init__(**options)  # requests' own proxy_manager dict stays empty: ours are per generation

    def init_poolmanager(self, connections: int, maxsize: int, block: bool = False, **pool_kwargs: Any) -> None:
        """Keep the settings for each generation's ``PoolManager`` (requests calls this from ``__init__``)."""
        self._pool_connections, self._pool_maxsize, self._pool_block = connections, maxsize, block
        self._manager_options = {"num_pools": connections, "maxsize": maxsize, "block": block, **pool_kwargs}

    def _make(self, generation: int) -> _Managers:
        return _Managers(self._own.context, self._manager_options)

    def _current(self) -> _Managers:
        chosen: _Managers | None = getattr(self._chosen, "managers", None)
        if chosen is None:
            raise RuntimeError("ReloadingAdapter chooses its pool managers per request: use send()")
        return chosen

    @property
    def poolmanager(self) -> PoolManager:
        """The direct ``PoolManager`` of the request this thread is sending (requests reads it there).

        Raises:
            RuntimeError: outside :meth:`send`.
        """
        return self._current().direct

    @poolmanager.setter
    def poolmanager(self, value: PoolManager) -> None:
        raise AttributeError("ReloadingAdapter makes its pool managers from its ClientIdentity")

    def proxy_manager_for(self, proxy: str, **proxy_kwargs: Any) -> PoolManager:
        """The urllib3 manager for ``proxy`` in the generation of the request this thread is sending, made as
        ``HTTPAdapter.proxy_manager_for`` makes it (``proxy_from_url`` with :meth:`proxy_headers`, or
        ``SOCKSProxyManager``), with that generation's context for the TLS to the server through the proxy.

        Args:
            proxy: the proxy URL, with its scheme.
            **proxy_kwargs: more for the manager when it is made (as requests takes them).

        Returns:
            The ``ProxyManager`` (``SOCKSProxyManager``), one per proxy URL and generation.

        Raises:
            RuntimeError: outside :meth:`send`.
            requests.exceptions.InvalidSchema: a SOCKS proxy without PySocks installed.
        """
        managers = self._current()
        cafile, capath = self._proxy_trust(proxy)

        def make() -> PoolManager:
            return self._new_proxy_manager(proxy, managers.context, cafile, capath, proxy_kwargs)

        return managers.through((proxy, cafile, capath), make)

    def _proxy_trust(self, proxy: str) -> tuple[str | None, str | None]:
        """The CA file and directory requests alone would trust an HTTPS proxy with for this request's ``verify``:
        what its own ``cert_verify`` sets on a pool (urllib3 verifies the proxy with the pool's CA locations). Asked
        of requests rather than copied: which bundle ``verify=True`` means differs between its versions."""
        if not proxy.lower().startswith("https"):
            return None, None
        probe = types.SimpleNamespace(cert_reqs=None, ca_certs=None, ca_cert_dir=None, cert_file=None, key_file=None)
        super().cert_verify(probe, proxy, getattr(self._chosen, "verify", True), None)
        return probe.ca_certs, probe.ca_cert_dir

    def _new_proxy_manager(
        self,
        proxy: str,
        context: ssl.SSLContext,
        cafile: str | None,
        capath: str | None,
        proxy_kwargs: dict[str, Any],
    ) -> PoolManager:
        # The sizes requests gives its own proxy managers: the adapter's, not init_poolmanager's other pool_kwargs.
        sizes: dict[str, Any] = {
            "num_pools": self._pool_connections,
            "maxsize": self._pool_maxsize,
            "block": self._pool_block,
        }
        if proxy.lower().startswith("socks"):
            if SOCKSProxyManager is None:
                raise InvalidSchema("Missing dependencies for SOCKS support.")
            username, password = get_auth_from_url(proxy)
            socks: PoolManager = SOCKSProxyManager(
                proxy, username=username, password=password, ssl_context=context, **sizes, **proxy_kwargs
            )
            return socks
        if cafile or capath:
            # The pool's CA locations stay unset (urllib3 would load them into the identity's context, the one the
            # server is verified with): the proxy gets a context of its own (hostname checked by ssl, which
            # urllib3 1.26 relies on for a context it is given).
            if _URLLIB3_1 and _is_ip_address(parse_url(proxy).host):
                # urllib3 1.26 gives no server_hostname for an IP address, and ssl then cannot check it: refused
                # here rather than verified less than requests alone would.
                raise ProxyError(
                    "an HTTPS proxy given by IP address needs urllib3 2 with a ReloadingAdapter: name it by host name"
                )
            trusted = ssl.create_default_context(cafile=cafile, capath=capath)
            proxy_kwargs = {"proxy_ssl_context": trusted, **proxy_kwargs}
        return proxy_from_url(
            proxy, proxy_headers=self.proxy_headers(proxy), ssl_context=context, **sizes, **proxy_kwargs
        )

    def send(
        self,
        request: PreparedRequest,
        stream: bool = False,
        timeout: Any = None,
        verify: Any = True,
        cert: Any = None,
        proxies: Any = None,
    ) -> Response:
        """Send ``request`` through the managers of the identity's newest generation (directly or through the
        proxy ``proxies`` selects, as ``HTTPAdapter.send`` does).

        Args:
            request: the prepared request.
            stream, timeout, proxies: as ``HTTPAdapter.send`` takes them.
            verify: anything but ``False``: the identity's CA bundle decides trust in the server; a CA bundle path
                decides trust in an HTTPS proxy, as with requests alone.
            cert: must be ``None``: the identity's certificate is presented.

        Returns:
            The response.

        Raises:
            ValueError: ``verify=False`` or ``cert`` given.
            requests.exceptions.RequestException: what ``HTTPAdapter.send`` raises.
        """
        if verify is False:
            raise ValueError("verify=False with a ReloadingAdapter: the ClientIdentity's CA bundle decides trust")
        if cert is not None:
            raise ValueError("cert= with a ReloadingAdapter: the ClientIdentity's certificate is presented")
        managers, to_clear = self._pools.acquire(self._own.generation)
        _clear_all(to_clear)
        self._chosen.managers, self._chosen.verify = managers, verify
        try:
            return super().send(request, stream=stream, timeout=timeout, verify=verify, cert=None, proxies=proxies)
        finally:
            self._chosen.managers = self._chosen.verify = None
            # Once send() returns, the connection carrying the response is out of the pool: clearing the managers
            # no longer takes it from under the response.
            to_clear = self._pools.release(managers)
            if managers.cleared and managers not in to_clear:
                # close() cleared them while this request was between choosing and having its connection: what it
                # made since (a pool, a proxy manager) is no longer held by the adapter and must not stay open.
                to_clear.append(managers)
            _clear_all(to_clear)

    def get_connection_with_tls_context(
        self, request: PreparedRequest, verify: Any, proxies: Any = None, cert: Any = None
    ) -> HTTPConnectionPool:
        """The pool for ``request`` in this request's direct or proxy manager (chosen as ``HTTPAdapter`` chooses),
        keyed with certificate verification required and nothing else: the manager's context holds the CAs and the
        certificate (requests would add a CA path or its own preloaded context, which urllib3 would load into, or
        put in place of, this one).

        Raises:
            requests.exceptions.InvalidURL: the URL's port is not a number, as with requests alone.
            requests.exceptions.InvalidProxyURL: the proxy URL has no host.
        """
        proxy = select_proxy(str(request.url), proxies)
        try:
            url = urlparse(str(request.url))
            scheme, hostname, port = url.scheme.lower(), url.hostname, url.port
        except ValueError as e:
            raise InvalidURL(e, request=request) from e
        manager = self.poolmanager
        if proxy:
            proxy = prepend_scheme_if_needed(proxy, "http")
            if not parse_url(proxy).host:
                raise InvalidProxyURL("Please check proxy URL. It is malformed and could be missing the host.")
            manager = self.proxy_manager_for(proxy)
        pool_kwargs: dict[str, Any] = {"cert_reqs": "CERT_REQUIRED"}
        if self.identity.authorizer is not None:  # the server's SPIFFE ID is checked in the handshake: not its name
            pool_kwargs["assert_hostname"] = False
        return manager.connection_from_host(hostname, port, scheme, pool_kwargs=pool_kwargs)

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
        """Close every pooled connection, direct and through proxies, of every generation (``Session.close`` calls
        this). As with ``HTTPAdapter.close``, the adapter still works afterwards: the next request makes new
        connections, with the identity's newest certificate."""
        _clear_all(self._pools.clear())


def _is_ip_address(host: str | None) -> bool:
    try:
        ipaddress.ip_address((host or "").strip("[]"))
    except ValueError:
        return False
    return True


def _clear_all(managers: list[_Managers]) -> None:
    for manager in managers:
        manager.clear()
