"""A SPIFFE Workload API server for the tests: ``FetchX509SVID`` over a Unix socket, on grpcio's generic handlers,
its ``X509SVIDResponse`` encoded by hand as SPIFFE's workload.proto lays it out.

Run as a process of its own (``python workload_api_server.py SOCKET STATE``): it streams the bytes of the file
``STATE`` (an encoded response) to every caller, again whenever they change; a call without the
``workload.spiffe.io: true`` header is refused, as SPIRE's agent refuses it. Stopping the process drops every
stream; starting it again on the same socket is the agent coming back. :class:`WorkloadAPI` drives it from a test,
and :func:`mint_svid`, :func:`encode_response` make what it sends.
"""

from __future__ import annotations

import datetime
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent
TRUST_DOMAIN = "spiffe://example.org"


# --- what it sends ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Svid:
    """One X509SVID as the Workload API sends it: DER chain (leaf first), PKCS#8 DER key, DER bundle."""

    spiffe_id: str
    chain: bytes
    key: bytes
    bundle: bytes
    serial: str = ""


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _field(number: int, data: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(data)) + data


def encode_response(svids: Sequence[Svid], *, crl: bytes = b"", federated: Mapping[str, bytes] | None = None) -> bytes:
    """An X509SVIDResponse: field 1 repeated X509SVID {1 spiffe_id, 2 x509_svid, 3 x509_svid_key, 4 bundle}, and
    a CRL (field 2) and a number field no reader knows, which readers skip; ``federated`` (trust domain's SPIFFE ID
    -> DER certificates, concatenated) as ``map<string, bytes> federated_bundles = 3``: one field 3 per entry, a
    message {1 key, 2 value}, as protobuf encodes a map."""
    out = b""
    for svid in svids:
        inner = _field(1, svid.spiffe_id.encode()) + _field(2, svid.chain) + _field(3, svid.key)
        inner += _field(4, svid.bundle) + _varint(5 << 3 | 0) + _varint(1)  # field 5: a "hint" of newer protos
        out += _field(1, inner)
    out += _field(2, crl) if crl else b""
    for domain, der in (federated or {}).items():
        out += _field(3, _field(1, domain.encode()) + _field(2, der))
    return out


def mint_svid(
    ca: Any,
    path: str,
    *dns: str,
    not_before: datetime.datetime | None = None,
    not_after: datetime.datetime | None = None,
    trust_domain: str = TRUST_DOMAIN,
) -> Svid:
    """An X.509 SVID for ``spiffe://example.org/<path>`` (or ``<trust_domain>/<path>``) signed by the trustme CA
    ``ca`` (DNS names too, as SPIRE entries may carry), with the trust domain's bundle (``ca``'s certificate); valid
    from five minutes ago for an hour unless given."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID

    issuer_key = serialization.load_pem_private_key(ca.private_key_pem.bytes(), None)
    issuer = x509.load_pem_x509_certificate(ca.cert_pem.bytes())
    key = ec.generate_private_key(ec.SECP256R1())
    spiffe_id = f"{trust_domain}/{path}"
    now = datetime.datetime.now(datetime.timezone.utc)
    names: list[x509.GeneralName] = [x509.UniformResourceIdentifier(spiffe_id)]
    names += [x509.DNSName(name) for name in dns]
    serial = x509.random_serial_number()
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([]))
        .issuer_name(issuer.subject)
        .public_key(key.public_key())
        .serial_number(serial)
        .not_valid_before(not_before or now - datetime.timedelta(minutes=5))
        .not_valid_after(not_after or now + datetime.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName(names), critical=True)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False
        )
        .sign(issuer_key, hashes.SHA256())
    )
    der = serialization.Encoding.DER
    pkcs8 = key.private_bytes(der, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    return Svid(spiffe_id, cert.public_bytes(der), pkcs8, issuer.public_bytes(der), format(serial, "X"))


# --- driving it from a test ------------------------------------------------------------------------


class WorkloadAPI:
    """The server as a process: :meth:`send` what it streams, :meth:`stop` and :meth:`start` it (a dropped stream,
    the agent back)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.socket = directory / "agent.sock"
        self.state = directory / "response.bin"
        self.log = directory / "workload-api.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"unix://{self.socket}"

    def send(self, svids: Sequence[Svid], *, federated: Mapping[str, bytes] | None = None) -> None:
        self.send_raw(encode_response(svids, federated=federated))

    def send_raw(self, message: bytes) -> None:
        staged = self.state.with_suffix(".tmp")
        staged.write_bytes(message)
        os.replace(staged, self.state)

    def start(self) -> WorkloadAPI:
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, str(Path(__file__)), str(self.socket), str(self.state)],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + 30
        while not self.socket.exists():  # the server binds the socket once it serves
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"the Workload API server did not start:\n{self.log.read_text()}")
            time.sleep(0.05)
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.proc = None
        self.socket.unlink(missing_ok=True)

    def __enter__(self) -> WorkloadAPI:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def gunicorn_on(api: WorkloadAPI, port: int, interval: str, **env: str) -> tuple[list[str], dict[str, str]]:
    """gunicorn's drop-in on ``api``'s SVIDs (``$TLSRELOAD_SPIFFE=1``, ``$SPIFFE_ENDPOINT_SOCKET``), two workers
    serving tests/gunicorn_apps' WSGI app on 127.0.0.1:``port``: its command line (for ``run_server``) and
    environment (tests/ importable, ``$TLSRELOAD_INTERVAL``, and ``env``)."""
    paths = [str(HERE), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    full = {"PYTHONPATH": os.pathsep.join(paths), "TLSRELOAD_INTERVAL": interval}
    full.update(TLSRELOAD_SPIFFE="1", SPIFFE_ENDPOINT_SOCKET=api.endpoint, **env)
    args = ["-m", "gunicorn", "-c", "python:tlsreload_plugins.gunicorn_conf", "--bind", f"127.0.0.1:{port}"]
    args += ["--no-control-socket", "--graceful-timeout", "5", "--workers", "2", "gunicorn_apps:wsgi"]
    return args, full


# --- the server --------------------------------------------------------------------------------------


def serve(socket_path: str, state: str) -> None:
    import grpc

    stopping = threading.Event()

    def fetch(request: bytes, context: Any) -> Any:
        if dict(context.invocation_metadata()).get("workload.spiffe.io") != "true":
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "security header missing from request")
        sent = None
        while context.is_active() and not stopping.is_set():
            try:
                current = Path(state).read_bytes()
            except FileNotFoundError:
                current = None
            if current is not None and current != sent:
                sent = current
                yield current
            stopping.wait(0.05)

    handler = grpc.method_handlers_generic_handler(
        "SpiffeWorkloadAPI",
        {
            "FetchX509SVID": grpc.unary_stream_rpc_method_handler(
                fetch, request_deserializer=None, response_serializer=None
            )
        },
    )
    server = grpc.server(ThreadPoolExecutor(max_workers=16))
    server.add_generic_rpc_handlers((handler,))
    server.add_insecure_port("unix:" + socket_path)
    server.start()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    print("serving", socket_path, flush=True)
    while not stopping.wait(0.2):
        pass
    server.stop(0).wait(10)


if __name__ == "__main__":
    serve(sys.argv[1], sys.argv[2])
