"""requests' glue against requests alone: every case is run with a stock session (``session.cert``,
``session.verify``) and with one that mounts a :class:`ReloadingAdapter`, and their outcomes compared (the answer,
or the exception's class, and which tunnels the proxy opened). Proxies given by ``proxies=``, by the environment
(``HTTPS_PROXY``, ``NO_PROXY``, ``trust_env``), with credentials, an HTTPS proxy; a session used after
``session.close()``. Against the mTLS server of tests/mtls_servers.py (it answers the serial of the client
certificate it saw) through the real CONNECT proxy of tests/connect_proxy.py.
"""

from __future__ import annotations

import base64
import ssl
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import trustme

from client_local import Here, clear_client_environment, local_world
from connect_proxy import ConnectProxy
from tlsreload_plugins.client import ClientIdentity
from tlsreload_plugins.client.requests import ReloadingAdapter
from tlstest import issue, wait_until


def stock_session(here: Here) -> requests.Session:
    """requests alone, given the same files."""
    session = requests.Session()
    session.cert = (str(here.files.cert_path), str(here.files.key_path))
    session.verify = str(here.files.ca_path)
    return session


def reloading_session(identity: ClientIdentity) -> requests.Session:
    session = requests.Session()
    session.mount("https://", ReloadingAdapter(identity))
    return session


@pytest.fixture(autouse=True)
def no_proxy_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    clear_client_environment(monkeypatch)


@pytest.fixture
def here(tmp_path: Path) -> Iterator[Here]:
    with local_world(tmp_path) as world:
        yield world


def outcome(session: requests.Session, url: str, proxy: ConnectProxy, **kwargs: Any) -> tuple[str, list[str]]:
    """The answer (the serial the server saw), or the exception's class; and the tunnels the proxy opened for it."""
    before = len(proxy.tunnels)
    try:
        answer = session.get(url, timeout=10, **kwargs).text.strip()
    except requests.RequestException as e:
        answer = type(e).__name__
    return answer, proxy.tunnels[before:]


def both(here: Here, identity: ClientIdentity) -> dict[str, requests.Session]:
    return {"stock": stock_session(here), "ours": reloading_session(identity)}


def compare(sessions: dict[str, requests.Session], run: Callable[[requests.Session], object]) -> object:
    """``run`` with each session; its outcomes must be the same. Returns that outcome."""
    outcomes = {kind: run(session) for kind, session in sessions.items()}
    assert outcomes["ours"] == outcomes["stock"], outcomes
    return outcomes["ours"]


def test_through_a_connect_proxy_given_by_proxies(here: Here) -> None:
    identity = here.identity()
    first = identity.presented.leaf.serial
    sessions = both(here, identity)
    with ConnectProxy() as proxy:
        through = {"https": proxy.url}
        assert compare(sessions, lambda s: outcome(s, here.url, proxy, proxies=through)) == (first, [here.target])
        # A session's proxies, and a pooled tunnel used again (no new CONNECT).
        for session in sessions.values():
            session.proxies = through
        assert compare(sessions, lambda s: outcome(s, here.url, proxy)) == (first, [])
        assert proxy.active == 2
        sessions["stock"].close()
        wait_until(lambda: proxy.active == 1, 10, what="the stock session's tunnel to close")

        # The client's files rotate: the old generation's idle tunnel is closed at the check, and the next request
        # opens a new one, presenting the new certificate inside it.
        ours = sessions["ours"]
        new = here.rotate(identity)
        wait_until(lambda: proxy.active == 0, 10, what="the replaced generation's tunnel to close")
        assert outcome(ours, here.url, proxy) == (new.serial, [here.target])
        assert outcome(ours, here.url, proxy, proxies=through) == (new.serial, [])
        # Direct, beside the proxy: the same generation's direct manager.
        assert ours.get(here.url, timeout=10, proxies={}).text.strip() == new.serial


def test_through_the_proxy_the_environment_gives(here: Here, monkeypatch: pytest.MonkeyPatch) -> None:
    identity = here.identity()
    first = identity.presented.leaf.serial
    sessions = both(here, identity)
    with ConnectProxy() as proxy:
        monkeypatch.setenv("HTTPS_PROXY", proxy.url)
        assert compare(sessions, lambda s: outcome(s, here.url, proxy)) == (first, [here.target])
        # NO_PROXY covering the host: direct, the proxy sees nothing.
        monkeypatch.setenv("NO_PROXY", "localhost")
        assert compare(sessions, lambda s: outcome(s, here.url, proxy)) == (first, [])
        monkeypatch.delenv("NO_PROXY")
        assert compare(sessions, lambda s: outcome(s, here.url, proxy)) == (first, [])  # the pooled tunnel
        # trust_env off: the environment's proxy is not used.
        for session in sessions.values():
            session.close()
            session.trust_env = False
        assert compare(sessions, lambda s: outcome(s, here.url, proxy)) == (first, [])
        # A session's own proxies still are.
        assert compare(sessions, lambda s: outcome(s, here.url, proxy, proxies={"https": proxy.url})) == (
            first,
            [here.target],
        )


def test_proxy_authorization_from_the_proxy_url(here: Here) -> None:
    identity = here.identity()
    first = identity.presented.leaf.serial
    sessions = both(here, identity)
    with ConnectProxy(credentials="user:pass") as proxy:
        expected, wrong_one = (f"Basic {base64.b64encode(pair).decode()}" for pair in (b"user:pass", b"user:nope"))
        authorized = {"https": proxy.url_with_credentials}
        assert compare(sessions, lambda s: outcome(s, here.url, proxy, proxies=authorized)) == (first, [here.target])
        assert proxy.authorizations == [expected, expected]
        # Refused (407): requests' ProxyError for both, no tunnel.
        wrong = {"https": proxy.url_with_credentials.replace("pass", "nope")}
        assert compare(sessions, lambda s: outcome(s, here.url, proxy, proxies=wrong)) == ("ProxyError", [])
        assert compare(sessions, lambda s: outcome(s, here.url, proxy, proxies={"https": proxy.url})) == (
            "ProxyError",
            [],
        )
        assert proxy.authorizations[2:] == [wrong_one, wrong_one, None, None]


def test_a_malformed_proxy_url_is_refused_as_requests_refuses_it(here: Here) -> None:
    identity = here.identity()
    with ConnectProxy() as proxy:
        assert compare(both(here, identity), lambda s: outcome(s, here.url, proxy, proxies={"https": "http://"})) == (
            "InvalidProxyURL",
            [],
        )


def test_through_an_https_proxy_trusted_by_verify(here: Here, tmp_path: Path) -> None:
    """The proxy's own certificate is trusted as requests alone trusts it, from ``verify``; the identity's CA
    bundle still decides trust in the server."""
    identity = here.identity()
    first = identity.presented.leaf.serial
    proxy_ca = trustme.CA()
    proxy_pair = issue(proxy_ca)  # for localhost and 127.0.0.1
    (tmp_path / "proxy.crt").write_bytes(proxy_pair.chain)
    (tmp_path / "proxy.key").write_bytes(proxy_pair.key)
    proxy_context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    proxy_context.load_cert_chain(tmp_path / "proxy.crt", tmp_path / "proxy.key")
    # requests alone needs one bundle for both; ours is given the proxy's CA alone (the server's is the identity's).
    both_cas = tmp_path / "both.pem"
    both_cas.write_bytes(here.server_ca.cert_pem.bytes() + proxy_ca.cert_pem.bytes())
    proxy_cas = tmp_path / "proxy-ca.pem"
    proxy_cas.write_bytes(proxy_ca.cert_pem.bytes())
    stock, ours = stock_session(here), reloading_session(identity)
    stock.verify = str(both_cas)
    with ConnectProxy(tls=proxy_context) as proxy:
        # By name (the proxy's certificate has it), as urllib3 1.26 can check an HTTPS proxy's name only then.
        through = {"https": proxy.url.replace("127.0.0.1", "localhost")}
        assert outcome(stock, here.url, proxy, proxies=through) == (first, [here.target])
        assert outcome(ours, here.url, proxy, proxies=through, verify=str(proxy_cas)) == (first, [here.target])
        # From the environment, as requests alone reads it.
        with pytest.MonkeyPatch.context() as env:
            env.setenv("REQUESTS_CA_BUNDLE", str(proxy_cas))
            ours.close()
            assert outcome(ours, here.url, proxy, proxies=through) == (first, [here.target])
        # Not trusted by requests' default bundle: refused, for both alike (ProxyError with urllib3 2, SSLError
        # with 1.26).
        stock.verify, fresh = True, reloading_session(identity)
        refused = compare({"stock": stock, "ours": fresh}, lambda s: outcome(s, here.url, proxy, proxies=through))
        assert refused in [("ProxyError", []), ("SSLError", [])]
        with pytest.raises(requests.RequestException, match="CERTIFICATE_VERIFY_FAILED"):
            fresh.get(here.url, proxies=through, timeout=10)
        # The identity's context was not given the proxy's CA (urllib3 loads a pool's CA locations into it).
        assert len(identity.context.get_ca_certs()) == 1


def test_a_closed_session_works_again(here: Here) -> None:
    identity = here.identity()
    first = identity.presented.leaf.serial
    sessions = both(here, identity)
    with ConnectProxy() as proxy:
        direct: dict[str, str] = {}
        through = {"https": proxy.url}

        def close_then_ask(session: requests.Session) -> tuple[tuple[str, list[str]], tuple[str, list[str]]]:
            before = outcome(session, here.url, proxy, proxies=through)
            session.close()
            return before, outcome(session, here.url, proxy, proxies=through)

        assert compare(sessions, close_then_ask) == ((first, [here.target]), (first, [here.target]))
        assert compare(sessions, lambda s: outcome(s, here.url, proxy, proxies=direct)) == (first, [])
        for session in sessions.values():
            session.close()
        wait_until(lambda: proxy.active == 0, 10, what="close() to close the tunnels")
        # Ours keeps following its identity after close().
        ours = sessions["ours"]
        new = here.rotate(identity)
        assert outcome(ours, here.url, proxy) == (new.serial, [])
        assert outcome(ours, here.url, proxy, proxies=through) == (new.serial, [here.target])


def test_verify_false_and_cert_are_refused(here: Here) -> None:
    session = reloading_session(here.identity())
    with pytest.raises(ValueError, match="verify=False"):
        session.get(here.url, verify=False, timeout=10)
    with pytest.raises(ValueError, match="cert="):
        session.get(here.url, cert=(str(here.files.cert_path), str(here.files.key_path)), timeout=10)
