"""Server CPU per mutual-TLS handshake with a CRL of 10,000 entries against none, side by side in the same run.

Two server contexts hold the same certificate, key and client-CA bundle and require client certificates; one
also checks a CRL of ``--entries`` revoked serials (the client's is not among them), loaded the way tlsreload
loads it (:func:`tlsreload_plugins.memory_files.check_revocation_of`: ``load_verify_locations`` on the
CRL's bytes in memory, ``VERIFY_CRL_CHECK_LEAF``). Each round does ``--handshakes`` full handshakes (no session
reuse) on each, in memory (``wrap_bio``: no sockets, no scheduler noise), alternating which goes first; only the
server side's steps are timed, with the thread's CPU clock. Prints the median server CPU per handshake of each,
the median of the per-round ratios (CRL / none) and their range, the CRL's size, and the cost of building a
context with it (what each reload of a CRL adds).

    python benchmarks/crl_handshakes.py                  # 7 rounds x 300 handshakes, 10,000 entries
    python benchmarks/crl_handshakes.py --quick          # 3 rounds x 100 handshakes
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import ssl
import statistics
import time

import trustme
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization

from tlsreload_plugins.memory_files import check_revocation_of


def big_crl(ca: trustme.CA, entries: int) -> bytes:
    """A CRL issued by ``ca`` revoking ``entries`` serials nobody holds."""
    issuer = x509.load_pem_x509_certificate(ca.cert_pem.bytes())
    key = serialization.load_pem_private_key(ca.private_key_pem.bytes(), None)
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = x509.CertificateRevocationListBuilder().issuer_name(issuer.subject)
    builder = builder.last_update(now - datetime.timedelta(minutes=5)).next_update(now + datetime.timedelta(days=1))
    for serial in range(1, entries + 1):
        revoked = x509.RevokedCertificateBuilder().serial_number(serial * 7919 + 1).revocation_date(now)
        builder = builder.add_revoked_certificate(revoked.build())
    return builder.sign(key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM)  # type: ignore[arg-type]


def server_context(server: trustme.LeafCert, client_ca: trustme.CA) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.configure_cert(context)
    client_ca.configure_trust(context)
    context.verify_mode = ssl.CERT_REQUIRED
    return context


def handshake_cpu(server: ssl.SSLContext, client: ssl.SSLContext) -> float:
    """Seconds of this thread's CPU the server side of one full handshake took (and the client got in)."""
    s_in, s_out, c_in, c_out = ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO()
    s = server.wrap_bio(s_in, s_out, server_side=True)
    c = client.wrap_bio(c_in, c_out, server_hostname="localhost")
    spent = 0.0
    for _ in range(10):
        with contextlib.suppress(ssl.SSLWantReadError):
            c.do_handshake()
        s_in.write(c_out.read())
        start = time.thread_time()
        with contextlib.suppress(ssl.SSLWantReadError):
            s.do_handshake()
        spent += time.thread_time() - start
        c_in.write(s_out.read())
        if c.version() is not None and not s_out.pending and not c_out.pending:
            try:
                c.do_handshake()
                break
            except ssl.SSLWantReadError:
                continue
    s_in.write(c_out.read())
    start = time.thread_time()
    s.write(b"ok")
    spent += time.thread_time() - start
    c_in.write(s_out.read())
    assert c.read(2) == b"ok", "the client did not get in"
    return spent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--entries", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--handshakes", type=int, default=300)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.handshakes = 3, 100
    server_ca, client_ca = trustme.CA(), trustme.CA()
    leaf = server_ca.issue_cert("localhost")
    holder = client_ca.issue_cert("client.example")
    started = time.perf_counter()
    crl = big_crl(client_ca, args.entries)
    minted = time.perf_counter() - started
    plain = server_context(leaf, client_ca)
    with_crl = server_context(leaf, client_ca)
    builds = []
    for _ in range(5):
        context = server_context(leaf, client_ca)
        start = time.thread_time()
        check_revocation_of(context, crl)
        builds.append(time.thread_time() - start)
    check_revocation_of(with_crl, crl)
    client = ssl.create_default_context()
    server_ca.configure_trust(client)
    holder.configure_cert(client)
    client.options |= ssl.OP_NO_TICKET
    per_round: dict[str, list[float]] = {"none": [], "crl": []}
    ratios = []
    for index in range(args.rounds):
        order = [("none", plain), ("crl", with_crl)]
        if index % 2:
            order.reverse()
        spent = {}
        for name, context in order:
            spent[name] = statistics.median(handshake_cpu(context, client) for _ in range(args.handshakes))
            per_round[name].append(spent[name])
        ratios.append(spent["crl"] / spent["none"])
    none_us, crl_us = (statistics.median(per_round[name]) * 1e6 for name in ("none", "crl"))
    print(f"CRL: {args.entries} entries, {len(crl)} bytes PEM (minted in {minted:.1f} s)")
    print(
        f"rounds: {args.rounds} x {args.handshakes} full handshakes per side (TLS 1.3, client certificate, in memory)"
    )
    print(f"server CPU per handshake, no CRL:      {none_us:8.1f} us (median of round medians)")
    print(f"server CPU per handshake, with CRL:    {crl_us:8.1f} us")
    print(f"ratio CRL / none: median {statistics.median(ratios):.3f} (rounds {min(ratios):.3f} to {max(ratios):.3f})")
    print(f"loading the CRL into a context (each reload of it): median {statistics.median(builds) * 1e3:.1f} ms CPU")


if __name__ == "__main__":
    main()
