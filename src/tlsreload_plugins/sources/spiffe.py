"""A server's or a client's identity from SPIFFE's Workload API: :class:`SpiffeSource`.

A daemon thread holds the Workload API's ``FetchX509SVID`` stream open (gRPC over the agent's Unix socket, spoken
with ``grpcio`` alone: the request and the answers are bytes, decoded in
:mod:`tlsreload_plugins.sources.workload_api`) and pushes every update into a
:class:`~tlsreload_plugins.sources.pushed.PushedIdentity`: the SVID is the certificate and key, the trust domain's
bundle the CA bundle (client certificates' on a server, servers' on a client), followed by the federated trust
domains' bundles when asked for (``federation``). Everything downstream is the core reading files: an update becomes
a reload, a bundle that changes (a federated one appearing, changing or going included) a trust change, a malformed
SVID is refused by the readers while the last good one keeps serving. A stream that goes away is reported once
(WARNING, the socket named) and opened again with backoff, the files keeping the last identity written; its return
is one INFO line.

In a server with workers, the source runs once, in a child process of the parent (gunicorn's arbiter, uvicorn's
supervisor: :mod:`tlsreload_plugins.sources.source_process`), before any worker starts: the server's reader reads
the files like any others, the workers load what it published, and nothing but the source opens a stream.
The source's figures (:meth:`SpiffeSource.status`) reach them the same way, as a small file beside the others
(:mod:`tlsreload_plugins.sources.stream_status`), which their metrics read.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any

from tlsreload_plugins.files import TLSFiles
from tlsreload_plugins.sources.pushed import PushedIdentity
from tlsreload_plugins.sources.stream_status import StreamFigures, write_figures
from tlsreload_plugins.sources.workload_api import (
    ENDPOINT_ENV,
    FETCH_X509_SVID,
    METADATA,
    Federation,
    MalformedResponse,
    PemIdentity,
    channel_target,
    choose,
    federation_of,
)

if TYPE_CHECKING:  # grpcio is the [spiffe] extra: imported when a source starts, a missing extra one clear line
    import grpc  # type: ignore[import-untyped, import-not-found, unused-ignore]

__all__ = [
    "FIRST_SVID_TIMEOUT",
    "SPIFFE_KIND",
    "NoSVID",
    "SpiffeSource",
    "SpiffeStatus",
    "resolve_endpoint",
]

log: logging.Logger = logging.getLogger("tlsreload_plugins.sources.spiffe")

FIRST_SVID_TIMEOUT = 30.0
"""Seconds :class:`SpiffeSource` waits at start for the first SVID (an agent attests a new workload in seconds)."""

SPIFFE_KIND = "spiffe"
"""The kind of the private directory SVIDs are pushed into (``tlsreload-spiffe-...``): what the readers' expiry
lines look for to say the next SVID is to come from the Workload API."""

RETRY_FIRST = 0.2
"""Seconds before the first attempt to open the stream again after it went away; doubled each failed attempt."""

RETRY_MAX = 5.0
"""The longest wait between attempts to open the stream again."""


_Figures = tuple[str, bool, str | None, int, int, int, int, float | None]
"""The figures written for the other processes, less the time (:class:`~.stream_status.StreamFigures`)."""


class NoSVID(RuntimeError):
    """No SVID came from the Workload API within the time given at start (nothing to serve)."""


@dataclass(frozen=True, slots=True)
class SpiffeStatus:
    """What a :class:`SpiffeSource` did: whether its stream is open, the SPIFFE ID served, and its counters."""

    endpoint: str
    connected: bool
    spiffe_id: str | None
    updates: int
    """Updates written into the files (a message with the same bytes as the last writes nothing)."""
    drops: int
    """Times the stream went away (or could not be opened) after it had been open."""
    refused: int
    """Messages not written: malformed, holding no SVID, none with the SPIFFE ID asked for, or the files could not
    be written."""
    last_error: str | None
    reconnects: int = 0
    """Times the stream was open again after a drop (each an INFO line, "is back")."""
    not_after: float | None = None
    """When the SVID last written expires, Unix time (``None``: its DER does not say; the readers refuse it)."""
    federated: tuple[str, ...] = ()
    """The federated trust domains whose bundles the CA bundle holds (sorted)."""


def resolve_endpoint(socket: str | None) -> str:
    """The Workload API's address: ``socket``, else ``$SPIFFE_ENDPOINT_SOCKET``.

    Raises:
        ValueError: neither is set, or the address is not one SPIFFE allows (see
            :func:`~tlsreload_plugins.sources.workload_api.channel_target`).

    Example: ``resolve_endpoint(None)`` with ``SPIFFE_ENDPOINT_SOCKET=unix:///run/spire/agent.sock``.
    """
    endpoint = socket or os.environ.get(ENDPOINT_ENV) or ""
    if not endpoint:
        raise ValueError(f"no Workload API socket: give one, or set ${ENDPOINT_ENV} (unix:///path/to/agent.sock)")
    channel_target(endpoint)
    return endpoint


class SpiffeSource:
    """The workload's X.509 SVID and trust bundle from the Workload API, kept as files (:attr:`files`).

    Starts at once: opens the stream in a daemon thread and waits for the first SVID.

    Args:
        socket: the Workload API's address (``unix:///path``, a path, ``tcp://ip:port``), else
            ``$SPIFFE_ENDPOINT_SOCKET``.
        spiffe_id: serve the SVID with this SPIFFE ID (default: the first the Workload API sends, its default one).
            A message without it is refused (not written, the ID named in the WARNING line).
        federation: the federated trust domains whose bundles join the CA bundle, after the SVID's own: ``False``
            (none, the default), ``True`` (every one the Workload API sends), or trust domains (``"other.org"`` or
            ``"spiffe://other.org"``; one string is one domain). Peers of a domain asked for that the Workload API
            does not send are refused: said once at WARNING, and once more (INFO) when its bundle comes.
        timeout: seconds to wait for the first SVID (default :data:`FIRST_SVID_TIMEOUT`).
        parent: where the files' private directory is made (see
            :class:`~tlsreload_plugins.sources.pushed.PushedIdentity`).

    Raises:
        ValueError: no address, or not one SPIFFE allows; a federation name that is not a trust domain's.
        ImportError: grpcio is not installed (``pip install 'tlsreload-plugins[spiffe]'``).
        NoSVID: no SVID came within ``timeout`` (the source is closed).

    Example::

        with SpiffeSource() as source:                   # $SPIFFE_ENDPOINT_SOCKET
            files = source.files                          # certfile, keyfile, ca_certs (the bundle)
            with fresh_context(files.certfile, files.keyfile, ca_certs=files.ca_certs) as context:
                serve(ssl_context=context)

        SpiffeSource(federation=["spiffe://partner.org"])  # also trust partner.org's workloads
    """

    def __init__(
        self,
        socket: str | None = None,
        *,
        spiffe_id: str | None = None,
        federation: bool | Collection[str] = False,
        timeout: float | None = None,
        parent: str | None = None,
    ) -> None:
        self.endpoint: str = resolve_endpoint(socket)
        self.spiffe_id = spiffe_id
        self.federation: Federation = federation_of(federation)
        try:
            import grpc
        except ImportError as e:
            raise ImportError(
                f"reading SVIDs from the Workload API needs grpcio ({e}): pip install 'tlsreload-plugins[spiffe]'"
            ) from e
        self._grpc = grpc
        self.pushed: PushedIdentity = PushedIdentity(parent, kind=SPIFFE_KIND)
        self._stop = threading.Event()
        self._first = threading.Event()
        self._lock = threading.Lock()  # the state below, for a few assignments: never across I/O
        self._call: Any = None
        self._connected = False
        self._served: str | None = None
        self._updates = self._drops = self._refused = self._reconnects = 0
        self._not_after: float | None = None
        self._federated: tuple[str, ...] = ()
        self._last_error: str | None = None
        self._refusal_logged: str | None = None
        # The source's thread alone uses these: the trust domains asked for and not sent (None: no message written
        # yet), and the figures last written for the other processes (None: to write at the next change).
        self._missing: tuple[str, ...] | None = None
        self._published: _Figures | None = None
        self._publish_failure: str | None = None
        self._thread = threading.Thread(target=self._run, name="tlsreload-spiffe", daemon=True)
        self._thread.start()
        wait = FIRST_SVID_TIMEOUT if timeout is None else timeout
        if not self._first.wait(wait):
            reason = self._last_error or "no answer"
            self.close()
            raise NoSVID(f"no X.509 SVID from the Workload API at {self.endpoint} within {wait:g} s ({reason})")
        with self._lock:
            federated = self._federated
        trusting = f", trusting the federated bundles of {', '.join(federated)}" if federated else ""
        log.info("serving the SVID of %s from the Workload API at %s%s", self._served, self.endpoint, trusting)

    @property
    def files(self) -> TLSFiles:
        """The certificate, key and bundle files to configure a server (``ca_certs``: the client-CA bundle) or a
        :class:`~tlsreload_plugins.client.ClientIdentity` (the bundle servers are verified against) with."""
        return self.pushed.files

    def status(self) -> SpiffeStatus:
        """Whether the stream is open, the SPIFFE ID served, and the counters (never waits)."""
        with self._lock:
            return SpiffeStatus(
                self.endpoint,
                self._connected,
                self._served,
                self._updates,
                self._drops,
                self._refused,
                self._last_error,
                self._reconnects,
                self._not_after,
                self._federated,
            )

    # -- the stream ---------------------------------------------------------------------------

    def _run(self) -> None:
        delay = RETRY_FIRST
        while not self._stop.is_set():
            error, delivered = self._follow()
            if self._stop.is_set():
                return
            self._went_away(error)
            delay = RETRY_FIRST if delivered else min(delay * 2, RETRY_MAX)
            self._stop.wait(delay)

    def _follow(self) -> tuple[str, bool]:
        """Follow one stream until it ends; returns why it ended, and whether it delivered a message."""
        grpc = self._grpc
        channel = grpc.insecure_channel(channel_target(self.endpoint))
        delivered = False
        try:
            fetch = channel.unary_stream(FETCH_X509_SVID, request_serializer=None, response_deserializer=None)
            call = fetch(b"", metadata=METADATA)
            with self._lock:
                self._call = call
            if self._stop.is_set():
                call.cancel()
            for message in _messages(call):
                delivered = True
                self._take(message)
            return "the stream ended", delivered
        except grpc.RpcError as e:
            return _describe(e), delivered
        finally:
            with self._lock:
                self._call = None
            channel.close()

    def _take(self, message: bytes) -> None:
        """One message of the stream: written into the files, or refused (logged once per kind of refusal)."""
        back = False
        with self._lock:
            if not self._connected:
                back, self._connected = self._drops > 0, True
                self._reconnects += back
        if back:
            log.info("the Workload API at %s is back", self.endpoint)
        try:
            identity = choose(message, self.spiffe_id, self.federation)
            changed = self.pushed.push(identity.cert, identity.key, identity.bundle)
        except (MalformedResponse, OSError) as e:  # OSError: the files could not be written (a full filesystem)
            self._refuse(f"{e}" if isinstance(e, MalformedResponse) else f"writing {self.pushed.directory}: {e}")
            return
        with self._lock:
            federated_before = self._federated
            self._served = identity.spiffe_id
            self._updates += changed
            self._not_after = identity.not_after
            self._federated = identity.federated
            self._refusal_logged = None
        self._say_federation(identity, federated_before)
        self._publish()
        self._first.set()

    def _say_federation(self, identity: PemIdentity, before: tuple[str, ...]) -> None:
        """One line per change of the federated bundles written: a trust domain asked for that the Workload API
        does not send (WARNING), one whose bundle comes (INFO); with ``federation=True``, the set that changed."""
        missing_before, self._missing = self._missing, identity.missing
        if self.federation is True:
            if missing_before is not None and identity.federated != before:  # (the first is in the start line)
                log.info(
                    "the CA bundle from the Workload API at %s now holds the federated bundles of %s",
                    self.endpoint,
                    ", ".join(identity.federated) or "no other trust domain",
                )
            return
        gone = sorted(set(identity.missing) - set(missing_before or ()))
        came = sorted(set(missing_before or ()) - set(identity.missing))
        if gone:
            log.warning(
                "the Workload API at %s sends no bundle for the federated trust domain%s %s: %s peers are refused "
                "until it does",
                self.endpoint,
                "s" if len(gone) > 1 else "",
                ", ".join(gone),
                "their" if len(gone) > 1 else "its",
            )
        if came:
            log.info(
                "the Workload API at %s now sends the bundle of the federated trust domain%s %s: %s peers are trusted",
                self.endpoint,
                "s" if len(came) > 1 else "",
                ", ".join(came),
                "their" if len(came) > 1 else "its",
            )

    def _publish(self) -> None:
        """Write the figures for the server's other processes (their metrics) when one changed since the last
        written; a failure to write is said once per distinct problem and stops nothing."""
        with self._lock:
            figures: _Figures = (
                self.endpoint,
                self._connected,
                self._served,
                self._updates,
                self._drops,
                self._reconnects,
                self._refused,
                self._not_after,
            )
        if figures == self._published:
            return
        try:
            write_figures(self.pushed.directory, StreamFigures(*figures, time.time(), os.getpid()))
        except OSError as e:
            if self._stop.is_set():  # closing: the directory is going
                return
            problem = f"{e}"
            if problem != self._publish_failure:
                log.warning(
                    "the figures of the Workload API stream at %s could not be written for the metrics: %s",
                    self.endpoint,
                    problem,
                )
                self._publish_failure = problem
            return
        self._published, self._publish_failure = figures, None

    def _refuse(self, problem: str) -> None:
        """A message not written: counted, and logged once until a message is written again."""
        reason = f"a message from the Workload API at {self.endpoint} was not written: {problem}"
        with self._lock:
            self._refused += 1
            self._last_error = reason
            first_time, self._refusal_logged = self._refusal_logged != problem, problem
        if first_time:
            log.warning("%s; the last identity keeps serving", reason)
        self._publish()

    def _went_away(self, error: str) -> None:
        with self._lock:
            was_connected, self._connected = self._connected, False
            self._last_error = f"the Workload API at {self.endpoint}: {error}"
            self._drops += was_connected
        if was_connected:
            log.warning(
                "the Workload API stream at %s went away (%s): the last identity keeps serving; reconnecting",
                self.endpoint,
                error,
            )
        self._publish()

    # -- stopping -----------------------------------------------------------------------------

    def close(self) -> None:
        """Close the stream, stop the thread and remove the files. Idempotent; what a server loaded keeps
        serving until its next check finds the files gone."""
        self._stop.set()
        with self._lock:
            call = self._call
        if call is not None:
            call.cancel()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(10)
        self.pushed.close()

    def __enter__(self) -> SpiffeSource:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close()


def _describe(error: grpc.RpcError) -> str:
    """A gRPC failure in a few words: its status code and details."""
    code = getattr(error, "code", None)
    details = getattr(error, "details", None)
    name = code().name if callable(code) else "ERROR"
    return f"{name}: {details() if callable(details) else error}"


def _messages(call: grpc.Call) -> Iterator[bytes]:
    """The raw messages of a server-streaming call (bytes: no deserializer)."""
    for message in call:
        yield bytes(message)
