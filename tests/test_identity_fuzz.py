"""Property-based tests of identity parsing: whatever bytes are on disk, ``validate`` returns a ``Leaf`` or
raises ``InvalidIdentity`` naming a file, nothing else, and in time linear in the size of the input.

Inputs: random bytes, and real chains and keys from trustme mutated the ways files go wrong (truncated,
bytes flipped in the text and in the DER, blocks duplicated or reordered, BEGIN/END lines removed or
repeated thousands of times, base64 garbled, headers added, CRLF endings, wrong passwords).

Time is the CPU time of this thread (``time.thread_time``), which other load on the machine does not
inflate; an example over its budget is timed twice more and judged on the fastest run. The budget,
``FIXED + PER_KIB * KiB``, is far above linear parsing (about 0.1 ms per identity, microseconds per KiB)
and far below quadratic behaviour (seconds for 112 KiB). Runs derandomized, without an example
database, so that CI sees the same examples every time.
"""

from __future__ import annotations

import base64
import functools
import json
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
import trustme
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtensionOID, NameOID
from hypothesis import HealthCheck, Phase, given, note, settings
from hypothesis import strategies as st

from tlsreload_plugins.errors import InvalidIdentity
from tlsreload_plugins.files import Password, Snapshot, TLSFiles, fingerprint, read_files
from tlsreload_plugins.identity import Leaf, validate
from tlstest import PASSWORD, Pair, issue, with_password

WRONG = "Tr0ub4dor"
CERT, KEY, CA = "cert.pem", "key.pem", "ca.pem"
FIXED_FLOOR = 0.020  # seconds per validation, whatever its size
PER_KIB_FLOOR = 0.002  # seconds per KiB of input

# Derandomized, no database: the same examples on every run. No shrinking: a time failure would be
# re-timed for every shrink step, and the falsifying example is printed (with its note) as found.
FUZZ = settings(
    deadline=None,
    derandomize=True,
    database=None,
    phases=(Phase.explicit, Phase.generate),
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


# --- real material ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Identity:
    """A valid identity as files hold it; ``key`` None when the key is in the certificate file."""

    name: str
    cert: bytes
    key: bytes | None
    ca: bytes | None
    password: str | None


@functools.cache
def identities() -> tuple[Identity, ...]:
    root = trustme.CA()
    ecdsa = issue(root.create_child_ca())  # leaf + intermediate: two blocks to reorder
    rsa = issue(root, key_type=trustme.KeyType.RSA)
    bundle = trustme.CA().cert_pem.bytes() + root.cert_pem.bytes()
    return (
        Identity("ecdsa chain", ecdsa.chain, ecdsa.key, bundle, None),
        Identity("rsa", rsa.chain, rsa.key, None, None),
        Identity("ecdsa pkcs8 encrypted", ecdsa.chain, with_password(ecdsa, PASSWORD).key, None, PASSWORD),
        Identity("rsa traditional encrypted", rsa.chain, with_password(rsa, PASSWORD, True).key, bundle, PASSWORD),
        Identity("key after chain, one file", ecdsa.chain + ecdsa.key, None, None, None),
        Identity("key before chain, one file", rsa.key + rsa.chain, None, None, None),
    )


def snapshot(cert: bytes, key: bytes | None, ca: bytes | None) -> Snapshot:
    return Snapshot(
        files=TLSFiles(CERT, KEY if key is not None else None, CA if ca is not None else None),
        cert=cert,
        key=key,
        ca=ca,
    )


# --- the contract, timed ------------------------------------------------------------------------


@dataclass(frozen=True)
class Budget:
    fixed: float
    per_kib: float

    def for_size(self, size: int) -> float:
        return self.fixed + self.per_kib * size / 1024


def _timed(snap: Snapshot, password: Password) -> tuple[Leaf | InvalidIdentity, float]:
    start = time.thread_time()
    try:
        result: Leaf | InvalidIdentity = validate(snap, password)
    except InvalidIdentity as e:
        result = e
    return result, time.thread_time() - start


@functools.cache
def budget() -> Budget:
    """What valid input costs here, scaled up generously, and never below the floors."""
    ident = identities()[0]
    small = snapshot(ident.cert, ident.key, ident.ca)
    big_ca = b"".join(trustme.CA().cert_pem.bytes() for _ in range(8)) * 40  # about 190 KiB of valid certificates
    big = snapshot(ident.cert, ident.key, big_ca)
    fixed = min(_timed(small, None)[1] for _ in range(5))
    whole = min(_timed(big, None)[1] for _ in range(3))
    per_kib = max(whole - fixed, 0.0) / (len(big_ca) / 1024)
    return Budget(fixed=max(FIXED_FLOOR, 20 * fixed), per_kib=max(PER_KIB_FLOOR, 20 * per_kib))


def size_of(snap: Snapshot) -> int:
    return len(snap.cert) + len(snap.key or b"") + len(snap.ca or b"")


def assert_contract(snap: Snapshot, password: Password = None) -> Leaf | InvalidIdentity:
    """``validate`` returns a Leaf or raises InvalidIdentity naming a file, within the budget for the size."""
    result, took = _timed(snap, password)  # anything but InvalidIdentity escapes here and fails the test
    limit = budget().for_size(size_of(snap))
    if took > limit:  # a scheduler or GC hiccup: judge the fastest of three
        took = min(took, *(_timed(snap, password)[1] for _ in range(2)))
    assert took <= limit, (
        f"validate took {took * 1000:.0f} ms of CPU for {size_of(snap)} bytes (budget {limit * 1000:.0f} ms)"
    )
    if isinstance(result, InvalidIdentity):
        message = str(result)
        named = [name for name in (snap.files.certfile, snap.files.keyfile, snap.files.ca_certs) if name]
        assert any(name in message for name in named), f"no file named in {message!r}"
        if password:
            assert str(password) not in message, "never a password in a message"
    else:
        assert isinstance(result, Leaf)
    return result


# --- mutations ----------------------------------------------------------------------------------


def pem_blocks(data: bytes) -> tuple[bytes, list[bytes], bytes]:
    """``data`` as (text before the first block, PEM blocks, text after the last), found line by line
    (linear, unlike a lazy regex). Text between two blocks stays with the block before it."""
    head: list[bytes] = []
    blocks: list[bytes] = []
    current: list[bytes] | None = None
    for line in data.splitlines(keepends=True):
        if current is not None:
            current.append(line)
            if line.startswith(b"-----END "):
                blocks.append(b"".join(current))
                current = None
        elif line.startswith(b"-----BEGIN "):
            current = [line]
        elif blocks:
            blocks[-1] += line
        else:
            head.append(line)
    tail = b"".join(current or [])
    return b"".join(head), blocks, tail


def _pick(draw: st.DrawFn, items: list[bytes]) -> int:
    return draw(st.integers(0, len(items) - 1))


MARKER_LINES = [
    b"-----BEGIN PRIVATE KEY-----",
    b"-----BEGIN RSA PRIVATE KEY-----",
    b"-----BEGIN EC PRIVATE KEY-----",
    b"-----BEGIN ENCRYPTED PRIVATE KEY-----",
    b"-----END PRIVATE KEY-----",
    b"-----BEGIN CERTIFICATE-----",
    b"-----END CERTIFICATE-----",
    b"-----BEGIN",
]
HEADERS = [
    b"Proc-Type: 4,ENCRYPTED\nDEK-Info: AES-128-CBC,00112233445566778899AABBCCDDEEFF\n\n",
    b"Proc-Type: 4,ENCRYPTED\n\n",
    b"Comment: a header the format does not have\n\n",
    b"Subject: CN=localhost\nIssuer: CN=somebody\n\n",
]


@st.composite
def mutate(draw: st.DrawFn, data: bytes) -> bytes:
    """One way a file goes wrong, applied to ``data``; notes what was done."""
    op = draw(
        st.sampled_from(
            [
                "truncate",
                "flip byte",
                "flip DER byte",
                "duplicate block",
                "reorder blocks",
                "drop marker line",
                "repeat marker line",
                "repeat distinct BEGIN labels",
                "garble base64",
                "add header",
                "crlf",
                "insert bytes",
            ]
        )
    )
    head, blocks, tail = pem_blocks(data)
    if op == "truncate":
        cut = draw(st.integers(0, len(data)))
        note(f"truncate at {cut}")
        return data[:cut]
    if op == "flip byte" and data:
        at, bits = draw(st.integers(0, len(data) - 1)), draw(st.integers(1, 255))
        note(f"flip byte {at} with {bits:#x}")
        return data[:at] + bytes([data[at] ^ bits]) + data[at + 1 :]
    if op == "flip DER byte" and blocks:
        i = _pick(draw, blocks)
        lines = blocks[i].splitlines()
        body = b"".join(line for line in lines[1:-1] if b":" not in line)
        try:
            der = base64.b64decode(body, validate=True)
        except ValueError:
            return data
        if not der:
            return data
        at, bits = draw(st.integers(0, len(der) - 1)), draw(st.integers(1, 255))
        note(f"block {i}: flip DER byte {at} of {len(der)} with {bits:#x}")
        der = der[:at] + bytes([der[at] ^ bits]) + der[at + 1 :]
        text = base64.b64encode(der)
        blocks[i] = (
            lines[0] + b"\n" + b"\n".join(text[j : j + 64] for j in range(0, len(text), 64)) + b"\n" + lines[-1] + b"\n"
        )
        return head + b"".join(blocks) + tail
    if op == "duplicate block" and blocks:
        i, j = _pick(draw, blocks), draw(st.integers(0, len(blocks)))
        note(f"copy block {i} to {j}")
        blocks.insert(j, blocks[i])
        return head + b"".join(blocks) + tail
    if op == "reorder blocks" and len(blocks) > 1:
        order = draw(st.permutations(range(len(blocks))))
        note(f"blocks in order {order}")
        return head + b"".join(blocks[k] for k in order) + tail
    if op == "drop marker line":
        lines = data.splitlines(keepends=True)
        markers = [k for k, line in enumerate(lines) if line.startswith(b"-----")]
        if markers:
            k = draw(st.sampled_from(markers))
            note(f"drop line {k}: {lines[k]!r}")
            return b"".join(lines[:k] + lines[k + 1 :])
    if op == "repeat marker line":
        line = draw(st.sampled_from(MARKER_LINES)) + draw(st.sampled_from([b"\n", b"\r\n", b""]))
        times = draw(st.integers(1000, 4000))
        at = draw(st.sampled_from([0, len(data), len(head) + len(blocks[0]) if blocks else 0]))
        note(f"insert {line!r} x {times} at {at}")
        return data[:at] + line * times + data[at:]
    if op == "repeat distinct BEGIN labels":
        times = draw(st.integers(1000, 3000))
        at = draw(st.sampled_from([0, len(data)]))
        note(f"insert {times} BEGIN lines with distinct labels at {at}")
        return data[:at] + b"".join(b"-----BEGIN X%d PRIVATE KEY-----\n" % k for k in range(times)) + data[at:]
    if op == "garble base64" and blocks:
        i = _pick(draw, blocks)
        block = blocks[i]
        at = draw(st.integers(0, len(block) - 1))
        char = draw(st.sampled_from(list(b"!*=.-_ \t\x00\xffA/+")))
        note(f"block {i}: byte {at} becomes {bytes([char])!r}")
        blocks[i] = block[:at] + bytes([char]) + block[at + 1 :]
        return head + b"".join(blocks) + tail
    if op == "add header" and blocks:
        i = _pick(draw, blocks)
        header = draw(st.sampled_from(HEADERS))
        first, _, rest = blocks[i].partition(b"\n")
        note(f"block {i}: header {header!r}")
        blocks[i] = first + b"\n" + header + rest
        return head + b"".join(blocks) + tail
    if op == "crlf":
        note("CRLF line endings")
        return data.replace(b"\n", b"\r\n")
    if op == "insert bytes":
        at, extra = draw(st.integers(0, len(data))), draw(st.binary(min_size=1, max_size=64))
        note(f"insert {extra!r} at {at}")
        return data[:at] + extra + data[at:]
    return data


@st.composite
def hostile_identity(draw: st.DrawFn) -> tuple[Snapshot, Password]:
    """A real identity, one to four of its parts mutated, sometimes parts swapped, with some password."""
    ident = draw(st.sampled_from(identities()))
    parts = {"cert": ident.cert, "key": ident.key, "ca": ident.ca}
    note(f"identity: {ident.name}")
    for _ in range(draw(st.integers(1, 4))):
        which = draw(st.sampled_from([name for name, value in parts.items() if value is not None]))
        note(f"in {which}:")
        parts[which] = draw(mutate(parts[which] or b""))
    if parts["key"] is not None and draw(st.integers(0, 9)) == 0:
        note("cert and key swapped")
        parts["cert"], parts["key"] = parts["key"], parts["cert"]
    password = draw(st.sampled_from([ident.password, ident.password, None, WRONG, "", b"\xff\x00"]))
    note(f"password {password!r}")
    return snapshot(parts["cert"] or b"", parts["key"], parts["ca"]), password


PEMISH = st.lists(
    st.one_of(st.binary(max_size=96), st.sampled_from([line + b"\n" for line in MARKER_LINES])), max_size=40
).map(b"".join)


# --- validate -----------------------------------------------------------------------------------


def test_valid_identities_are_accepted() -> None:
    for ident in identities():
        result = assert_contract(snapshot(ident.cert, ident.key, ident.ca), ident.password)
        assert isinstance(result, Leaf), f"{ident.name}: {result}"


@settings(FUZZ, max_examples=1000)
@given(hostile_identity())
def test_mutated_pem_is_a_leaf_or_invalid_identity_in_linear_time(case: tuple[Snapshot, Password]) -> None:
    assert_contract(*case)


@settings(FUZZ, max_examples=200)
@given(
    cert=st.one_of(st.binary(max_size=4096), PEMISH),
    key=st.one_of(st.none(), st.binary(max_size=4096), PEMISH),
    ca=st.one_of(st.none(), st.binary(max_size=1024), PEMISH),
    password=st.sampled_from([None, PASSWORD, b"\x00"]),
)
def test_random_bytes_are_invalid_identity(
    cert: bytes, key: bytes | None, ca: bytes | None, password: Password
) -> None:
    result = assert_contract(snapshot(cert, key, ca), password)
    assert isinstance(result, InvalidIdentity)


@settings(FUZZ, max_examples=100)
@given(ident=st.sampled_from(identities()), password=st.sampled_from([WRONG, "", "correct horse ", b"\xff"]))
def test_an_encrypted_key_with_a_wrong_password_is_invalid_identity(ident: Identity, password: Password) -> None:
    result = assert_contract(snapshot(ident.cert, ident.key, ident.ca), password)
    if ident.password is not None:
        assert isinstance(result, InvalidIdentity) and "password" in str(result)


# --- certificates cryptography parses lazily ----------------------------------------------------


def _leaf_with(extensions: list[x509.ExtensionType]) -> Pair:
    """A self-issued leaf carrying ``extensions`` as given (unparsed bytes for UnrecognizedExtension)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.now(timezone.utc)
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(hours=1))
        .not_valid_after(now + timedelta(days=1))
    )
    for extension in extensions:
        builder = builder.add_extension(extension, critical=False)
    cert = builder.sign(key, hashes.SHA256())
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return Pair(cert.public_bytes(serialization.Encoding.PEM), key_pem, format(cert.serial_number, "X"))


def _with_der(pem: bytes, edit: Callable[[bytes], bytes]) -> bytes:
    der = x509.load_pem_x509_certificate(pem).public_bytes(serialization.Encoding.DER)
    edited = edit(der)
    assert edited != der, "the edit found nothing to change"
    text = base64.b64encode(edited).decode()
    return (
        "-----BEGIN CERTIFICATE-----\n" + "\n".join(textwrap.wrap(text, 64)) + "\n-----END CERTIFICATE-----\n"
    ).encode()


EC_PUBLIC_KEY = bytes.fromhex("06072a8648ce3d0201")  # OID 1.2.840.10045.2.1
PRIME256V1 = bytes.fromhex("06082a8648ce3d030107")  # OID 1.2.840.10045.3.1.7

LAZY: dict[str, Callable[[], Pair]] = {
    "malformed subjectAltName": lambda: _leaf_with(
        [x509.UnrecognizedExtension(ExtensionOID.SUBJECT_ALTERNATIVE_NAME, b"\x30\x03\x02\x01\x00")]
    ),
    "subjectAltName that is not DER": lambda: _leaf_with(
        [x509.UnrecognizedExtension(ExtensionOID.SUBJECT_ALTERNATIVE_NAME, b"\xff\xff")]
    ),
    "malformed basicConstraints": lambda: _leaf_with(
        [x509.UnrecognizedExtension(ExtensionOID.BASIC_CONSTRAINTS, b"\x30\x03\x04\x01\x00")]
    ),
    "malformed keyUsage": lambda: _leaf_with([x509.UnrecognizedExtension(ExtensionOID.KEY_USAGE, b"\x04\x00")]),
    "unknown public key algorithm": lambda: _swap_der(EC_PUBLIC_KEY, bytes.fromhex("06072a8648ce3d0209")),
    "unknown curve": lambda: _swap_der(PRIME256V1, bytes.fromhex("06082a8648ce3d030109")),
}


def _swap_der(old: bytes, new: bytes) -> Pair:
    pair = _leaf_with([])
    return Pair(_with_der(pair.chain, lambda der: der.replace(old, new, 1)), pair.key, pair.serial)


@pytest.mark.parametrize("case", list(LAZY))
def test_a_certificate_that_fails_when_touched_is_invalid_identity(case: str) -> None:
    """cryptography parses extensions and public keys only when asked: what they raise must not escape."""
    pair = LAZY[case]()
    result = assert_contract(snapshot(pair.chain, pair.key, None))
    assert isinstance(result, InvalidIdentity), result


# --- quadratic behaviour: a child process, so that a quadratic parser cannot hold the test for minutes ---

CHILD = r"""
import json, sys, time
from tlsreload_plugins.errors import InvalidIdentity
from tlsreload_plugins.files import Snapshot, TLSFiles
from tlsreload_plugins.identity import validate

job = json.load(sys.stdin)
chain = job["chain"].encode()
for kib in job["sizes"]:
    n = kib * 1024
    if job["lines"] == "same":
        line = job["line"].encode()
        data = (line * (n // len(line) + 1))[:n]
    else:
        data = b"".join(b"-----BEGIN X%d PRIVATE KEY-----\n" % i for i in range(n // 30))[:n]
    cert, key = (data, None) if job["file"] == "cert" else (chain, data)
    snap = Snapshot(TLSFiles("cert.pem", "key.pem" if key is not None else None), cert, key, None)
    best, outcome = None, ""
    for _ in range(3):
        start = time.thread_time()
        try:
            validate(snap)
            outcome = "accepted"
        except InvalidIdentity as e:
            outcome = str(e)
        took = time.thread_time() - start
        best = took if best is None else min(best, took)
        if took > 1.0:
            break
    print(json.dumps({"kib": kib, "seconds": best, "outcome": outcome}), flush=True)
"""


def time_in_child(sizes: list[int], lines: str, file: str, timeout: float, line: str = "") -> list[dict[str, object]]:
    """CPU seconds for ``validate`` on each size; stops at ``timeout`` (the sizes not reached are missing)."""
    chain = identities()[0].cert.decode()
    job = json.dumps({"chain": chain, "sizes": sizes, "lines": lines, "file": file, "line": line})
    try:
        out = subprocess.run(
            [sys.executable, "-c", CHILD], input=job, capture_output=True, text=True, timeout=timeout
        ).stdout
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
    return [json.loads(row) for row in out.splitlines() if row.strip()]


MANY_BEGINS = {
    "key file of BEGIN PRIVATE KEY lines": ("same", "key", "-----BEGIN PRIVATE KEY-----\n"),
    "key file of BEGIN RSA PRIVATE KEY lines": ("same", "key", "-----BEGIN RSA PRIVATE KEY-----\n"),
    "key file of BEGIN lines, each label different": ("distinct", "key", ""),
    "certificate file of BEGIN PRIVATE KEY lines": ("same", "cert", "-----BEGIN PRIVATE KEY-----\n"),
    "certificate file of BEGIN CERTIFICATE lines": ("same", "cert", "-----BEGIN CERTIFICATE-----\n"),
}


@pytest.mark.parametrize("case", list(MANY_BEGINS))
@pytest.mark.parametrize("kib", [112, 1024])
def test_begin_lines_without_end_are_refused_quickly(case: str, kib: int) -> None:
    lines, file, line = MANY_BEGINS[case]
    limit = budget().for_size(kib * 1024)
    rows = time_in_child([kib], lines, file, timeout=limit + 10, line=line)
    assert rows, f"{kib} KiB: validate did not finish within {limit + 10:.0f} s"
    assert rows[0]["outcome"] != "accepted"
    took = float(str(rows[0]["seconds"]))
    assert took <= limit, f"{kib} KiB took {took:.2f} s of CPU (budget {limit:.2f} s)"


@pytest.mark.parametrize(
    "case", ["key file of BEGIN PRIVATE KEY lines", "key file of BEGIN lines, each label different"]
)
def test_doubling_the_begin_lines_doubles_the_time_not_quadruples_it(case: str) -> None:
    lines, file, line = MANY_BEGINS[case]
    rows = time_in_child([512, 1024], lines, file, timeout=30, line=line)
    assert len(rows) == 2, f"validate did not finish 512 KiB and 1 MiB within 30 s: {rows}"
    half, whole = (float(str(row["seconds"])) for row in rows)
    # Linear: about 2x. Slack for timer noise when both are a few milliseconds.
    assert whole <= 3 * half + 0.010, (
        f"512 KiB: {half * 1000:.1f} ms, 1 MiB: {whole * 1000:.1f} ms ({whole / half:.1f}x)"
    )


# --- read_files and fingerprint on real files ---------------------------------------------------


@pytest.fixture(scope="module")
def fuzz_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


@settings(FUZZ, max_examples=100)
@given(
    st.one_of(
        hostile_identity(), st.tuples(st.builds(snapshot, PEMISH, st.one_of(st.none(), PEMISH), st.none()), st.none())
    )
)
def test_read_files_reads_exactly_what_is_on_disk(fuzz_dir: Path, case: tuple[Snapshot, Password]) -> None:
    snap, password = case
    paths = TLSFiles(
        str(fuzz_dir / CERT),
        str(fuzz_dir / KEY) if snap.key is not None else None,
        str(fuzz_dir / CA) if snap.ca is not None else None,
    )
    for path, data in ((paths.certfile, snap.cert), (paths.keyfile, snap.key), (paths.ca_certs, snap.ca)):
        if path is not None and data is not None:
            Path(path).write_bytes(data)
    read = read_files(paths)
    assert (read.cert, read.key, read.ca) == (snap.cert, snap.key, snap.ca)
    assert fingerprint(read) == fingerprint(snap)
    assert_contract(read, password)


def test_a_file_over_1_mib_is_refused_naming_it(tmp_path: Path) -> None:
    ident = identities()[0]
    cert, key = tmp_path / CERT, tmp_path / KEY
    cert.write_bytes(ident.cert)
    key.write_bytes(ident.key + b"\n" * (1024 * 1024))  # a valid key, padded past the cap
    start = time.monotonic()
    with pytest.raises(InvalidIdentity) as error:
        validate(read_files(TLSFiles(str(cert), str(key))))
    assert str(key) in str(error.value)
    assert time.monotonic() - start < 2.0


def test_fingerprint_ignores_metadata(tmp_path: Path) -> None:
    ident = identities()[0]
    cert, key = tmp_path / CERT, tmp_path / KEY
    cert.write_bytes(ident.cert)
    key.write_bytes(ident.key)
    files = TLSFiles(str(cert), str(key))
    before = fingerprint(read_files(files))
    os.chmod(key, 0o600)
    os.utime(cert, (0, 0))
    assert fingerprint(read_files(files)) == before


PART = st.one_of(st.none(), st.binary(max_size=48))


@settings(FUZZ, max_examples=300)
@given(a=st.tuples(st.binary(max_size=48), PART, PART), b=st.tuples(st.binary(max_size=48), PART, PART))
def test_fingerprints_are_equal_exactly_when_the_bytes_are(
    a: tuple[bytes, bytes | None, bytes | None], b: tuple[bytes, bytes | None, bytes | None]
) -> None:
    assert (fingerprint(Snapshot(TLSFiles(CERT, KEY), *a)) == fingerprint(Snapshot(TLSFiles(CERT, KEY), *b))) == (
        a == b
    )


@settings(FUZZ, max_examples=200)
@given(st.binary(max_size=32), st.binary(min_size=1, max_size=32), st.binary(max_size=32))
def test_moving_bytes_between_files_changes_the_fingerprint(x: bytes, y: bytes, z: bytes) -> None:
    files = TLSFiles(CERT, KEY, CA)
    assert fingerprint(Snapshot(files, x + y, z, None)) != fingerprint(Snapshot(files, x, y + z, None))
    assert fingerprint(Snapshot(files, x, z, None)) != fingerprint(Snapshot(files, x, None, z))
    assert fingerprint(Snapshot(files, x, b"", None)) != fingerprint(Snapshot(files, x, None, None))
