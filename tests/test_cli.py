"""`tlsreload check`: the same verdict as the reloader, the certificate's details, and exit statuses
a deploy hook or a probe can rely on."""

from __future__ import annotations

import datetime
import ssl
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import trustme
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID

from tlsreload_plugins import InvalidIdentity, Reloader
from tlsreload_plugins.cli import EXIT_EXPIRY, EXIT_OK, EXIT_UNUSABLE, EXIT_USAGE, main
from tlstest import KubeletLayout, Pair, issue

TLSRELOAD = Path(sys.executable).with_name("tlsreload")
UTC = datetime.timezone.utc


def run_cli(*args: str | Path) -> subprocess.CompletedProcess[str]:
    """The installed console script, as a deploy hook or a probe runs it."""
    assert TLSRELOAD.exists(), f"the tlsreload console script is not installed next to {sys.executable}"
    return subprocess.run([str(TLSRELOAD), *map(str, args)], capture_output=True, text=True, timeout=60)


def check(capsys: pytest.CaptureFixture[str], *args: str | Path) -> tuple[int, str, str]:
    status = main(["check", *map(str, args)])
    out, err = capsys.readouterr()
    return status, out, err


def encrypted(key_pem: bytes, password: bytes) -> bytes:
    key = serialization.load_pem_private_key(key_pem, password=None)
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.BestAvailableEncryption(password)
    )


def weak_rsa_pair() -> tuple[bytes, bytes]:
    """A self-signed RSA-1024 pair: parses and matches, but OpenSSL's default security level refuses the key."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=1024)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=30))
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return cert.public_bytes(serialization.Encoding.PEM), key_pem


def reloader_accepts(cert: Path, key: Path, password: bytes | None = None) -> bool:
    """Does a Reloader, with a recipe like gunicorn's default, start on these files?"""

    def recipe() -> ssl.SSLContext:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(str(cert), str(key), password)
        return context

    try:
        Reloader(str(cert), str(key), recipe=recipe, password=password)
    except InvalidIdentity:
        return False
    return True


def test_usable_pair_in_a_kubelet_volume_prints_its_details(
    tmp_path: Path, ca: trustme.CA, capsys: pytest.CaptureFixture[str]
) -> None:
    layout = KubeletLayout(tmp_path / "secret")
    pair = issue(ca, "myapp.example", "10.0.0.7")
    layout.write_files({"tls.crt": pair.chain, "tls.key": pair.key, "ca.crt": ca.cert_pem.bytes()})

    status, out, err = check(capsys, "--cert", layout.cert_path, "--key", layout.key_path, "--ca", layout.ca_path)

    assert (status, err) == (EXIT_OK, "")
    fields = dict(line.split(":", 1) for line in out.splitlines())
    fields = {name: value.strip() for name, value in fields.items()}
    leaf = x509.load_pem_x509_certificate(pair.leaf)
    assert fields["serial"] == pair.serial
    assert fields["sans"] == "myapp.example, 10.0.0.7"
    assert fields["not_after"] == leaf.not_valid_after_utc.isoformat()
    assert fields["sha256"] == leaf.fingerprint(hashes.SHA256()).hex()
    assert 0 < float(fields["days_left"]) <= (leaf.not_valid_after_utc - leaf.not_valid_before_utc).days + 1
    assert str(layout.ca_path) in fields["files"]


def _swapped(d: Path, pair: Pair, other: Pair) -> tuple[Path, Path]:
    (d / "c").write_bytes(pair.chain)
    (d / "k").write_bytes(pair.key)
    return d / "k", d / "c"


def _mismatched(d: Path, pair: Pair, other: Pair) -> tuple[Path, Path]:
    (d / "c").write_bytes(pair.chain)
    (d / "k").write_bytes(other.key)
    return d / "c", d / "k"


def _truncated_cert(d: Path, pair: Pair, other: Pair) -> tuple[Path, Path]:
    (d / "c").write_bytes(pair.chain[: len(pair.chain) // 2])
    (d / "k").write_bytes(pair.key)
    return d / "c", d / "k"


def _empty_key(d: Path, pair: Pair, other: Pair) -> tuple[Path, Path]:
    (d / "c").write_bytes(pair.chain)
    (d / "k").write_bytes(b"")
    return d / "c", d / "k"


def _missing_key(d: Path, pair: Pair, other: Pair) -> tuple[Path, Path]:
    (d / "c").write_bytes(pair.chain)
    return d / "c", d / "absent.key"


def _directory_as_cert(d: Path, pair: Pair, other: Pair) -> tuple[Path, Path]:
    (d / "k").write_bytes(pair.key)
    return d, d / "k"


def _encrypted_without_password(d: Path, pair: Pair, other: Pair) -> tuple[Path, Path]:
    (d / "c").write_bytes(pair.chain)
    (d / "k").write_bytes(encrypted(pair.key, b"s3cret"))
    return d / "c", d / "k"


def _weak_key(d: Path, pair: Pair, other: Pair) -> tuple[Path, Path]:
    cert, key = weak_rsa_pair()
    (d / "c").write_bytes(cert)
    (d / "k").write_bytes(key)
    return d / "c", d / "k"


BAD: dict[str, tuple[Callable[[Path, Pair, Pair], tuple[Path, Path]], str]] = {
    "swapped": (_swapped, "holds a private key, not a certificate"),
    "mismatched": (_mismatched, "does not match the certificate"),
    "truncated": (_truncated_cert, "truncated"),
    "empty key": (_empty_key, "is empty"),
    "missing key": (_missing_key, "does not exist"),
    "directory": (_directory_as_cert, "is a directory"),
    "encrypted, no password": (_encrypted_without_password, "encrypted and no password"),
    # Only OpenSSL refuses this one: check must build a real context, as the reloader does.
    "RSA-1024": (_weak_key, "could not be built"),
}


@pytest.mark.parametrize("case", BAD)
def test_unusable_pair_exits_1_with_the_reason_the_reloader_gives(
    case: str, tmp_path: Path, ca: trustme.CA, capsys: pytest.CaptureFixture[str]
) -> None:
    make, reason = BAD[case]
    cert, key = make(tmp_path, issue(ca), issue(ca))

    status, out, err = check(capsys, "--cert", cert, "--key", key)

    assert status == EXIT_UNUSABLE
    assert out == ""
    assert err.startswith("tlsreload check: NOT USABLE: ") and reason in err, err
    assert len(err.strip().splitlines()) == 1, err
    assert not reloader_accepts(cert, key)


def test_password_file_with_a_trailing_newline(
    tmp_path: Path, ca: trustme.CA, capsys: pytest.CaptureFixture[str]
) -> None:
    pair = issue(ca)
    (tmp_path / "c").write_bytes(pair.chain)
    (tmp_path / "k").write_bytes(encrypted(pair.key, b"s3cret"))
    (tmp_path / "right").write_bytes(b"s3cret\n")
    (tmp_path / "wrong").write_bytes(b"nope\n")
    cert, key = tmp_path / "c", tmp_path / "k"

    status, out, _ = check(capsys, "--cert", cert, "--key", key, "--password-file", tmp_path / "right")
    assert status == EXIT_OK and pair.serial in out
    assert reloader_accepts(cert, key, b"s3cret")

    status, _, err = check(capsys, "--cert", cert, "--key", key, "--password-file", tmp_path / "wrong")
    assert status == EXIT_UNUSABLE and "wrong password" in err
    assert not reloader_accepts(cert, key, b"nope")

    status, _, err = check(capsys, "--cert", cert, "--key", key, "--password-file", tmp_path / "absent")
    assert status == EXIT_UNUSABLE and "key password file" in err and "does not exist" in err


def test_expired_not_yet_valid_and_warn_days_exit_3(
    tmp_path: Path, ca: trustme.CA, capsys: pytest.CaptureFixture[str]
) -> None:
    now = datetime.datetime.now(UTC)
    expired = issue(ca, not_before=now - datetime.timedelta(days=10), not_after=now - datetime.timedelta(days=1))
    future = issue(ca, not_before=now + datetime.timedelta(days=1), not_after=now + datetime.timedelta(days=30))
    soon = issue(ca, not_before=now - datetime.timedelta(days=1), not_after=now + datetime.timedelta(days=5))
    paths = {}
    for name, pair in (("expired", expired), ("future", future), ("soon", soon)):
        (tmp_path / f"{name}.crt").write_bytes(pair.chain)
        (tmp_path / f"{name}.key").write_bytes(pair.key)
        paths[name] = ("--cert", tmp_path / f"{name}.crt", "--key", tmp_path / f"{name}.key")

    status, out, err = check(capsys, *paths["expired"])
    assert status == EXIT_EXPIRY and expired.serial in out and "expired at" in err
    assert "a running reloader refuses this pair" in err  # as Reloader.check does: judge_period

    status, out, err = check(capsys, *paths["future"])
    assert status == EXIT_EXPIRY and future.serial in out and "not valid before" in err
    assert "a running reloader refuses this pair" in err

    assert check(capsys, *paths["soon"])[0] == EXIT_OK
    status, _, err = check(capsys, *paths["soon"], "--warn-days", "7")
    assert status == EXIT_EXPIRY and "expires in" in err and "within --warn-days 7" in err, err
    assert check(capsys, *paths["soon"], "--warn-days", "4")[0] == EXIT_OK


def test_console_script_exit_statuses_and_no_traceback(tmp_path: Path, ca: trustme.CA) -> None:
    pair = issue(ca)
    (tmp_path / "tls.crt").write_bytes(pair.chain)
    (tmp_path / "tls.key").write_bytes(pair.key)
    (tmp_path / "junk").write_bytes(b"\x00\xff" * 100)

    ok = run_cli("check", "--cert", tmp_path / "tls.crt", "--key", tmp_path / "tls.key")
    assert ok.returncode == EXIT_OK and pair.serial in ok.stdout and ok.stderr == ""

    # The key inside the certificate file, as ssl allows.
    (tmp_path / "both.pem").write_bytes(pair.chain + pair.key)
    assert run_cli("check", "--cert", tmp_path / "both.pem").returncode == EXIT_OK

    bad = run_cli("check", "--cert", tmp_path / "junk", "--key", tmp_path / "junk")
    assert bad.returncode == EXIT_UNUSABLE and "holds no PEM certificate" in bad.stderr

    for usage in (["check"], ["check", "--cert"], ["check", "--cert", "c", "--warn-days", "soon"], ["frobnicate"]):
        result = run_cli(*usage)
        assert result.returncode == EXIT_USAGE, usage
        assert "usage: tlsreload" in result.stderr
    for result in (ok, bad):
        assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    "spelling",
    [
        ("--cert", "--key", "--ca"),
        ("--certfile", "--keyfile", "--ca-certs"),
        ("--ssl-certfile", "--ssl-keyfile", "--ssl-ca-certs"),
    ],
    ids=["tlsreload", "gunicorn", "uvicorn"],
)
def test_each_servers_option_names_are_accepted(
    spelling: tuple[str, str, str], tmp_path: Path, ca: trustme.CA, capsys: pytest.CaptureFixture[str]
) -> None:
    layout = KubeletLayout(tmp_path / "secret")
    pair = issue(ca)
    layout.write_files({"tls.crt": pair.chain, "tls.key": pair.key, "ca.crt": ca.cert_pem.bytes()})
    cert, key, client_ca = spelling

    status, out, err = check(capsys, cert, layout.cert_path, key, layout.key_path, client_ca, layout.ca_path)

    assert (status, err) == (EXIT_OK, ""), err
    assert pair.serial in out and str(layout.ca_path) in out


def test_password_file_is_read_as_the_servers_read_it(
    tmp_path: Path, ca: trustme.CA, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """First line only (a comment or a second line after it is not part of the password), and
    $TLSRELOAD_KEY_PASSWORD_FILE when --password-file is not given."""
    pair = issue(ca)
    (tmp_path / "c").write_bytes(pair.chain)
    (tmp_path / "k").write_bytes(encrypted(pair.key, b"s3cret"))
    (tmp_path / "pw").write_bytes(b"s3cret\r\nrotated by vault at 12:00\n")
    args = ("--certfile", tmp_path / "c", "--keyfile", tmp_path / "k")

    assert check(capsys, *args, "--password-file", tmp_path / "pw")[0] == EXIT_OK
    status, _, err = check(capsys, *args)
    assert status == EXIT_UNUSABLE and "encrypted and no password" in err
    monkeypatch.setenv("TLSRELOAD_KEY_PASSWORD_FILE", str(tmp_path / "pw"))
    assert check(capsys, *args)[0] == EXIT_OK


def self_signed(serial: int) -> tuple[bytes, bytes]:
    """A self-signed EC P-256 pair with the given serial number."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(serial)
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=30))
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return cert.public_bytes(serialization.Encoding.PEM), key_pem


# Where printers differ: an odd number of hex digits, a high first bit (DER adds a 00 byte), a 20-byte serial.
SERIALS = [1, 0xF18, 0x80FF, 0x7F, x509.random_serial_number(), (1 << 158) + 0xABC]


@pytest.mark.parametrize("serial", SERIALS, ids=hex)
def test_serial_is_printed_as_openssl_prints_it(tmp_path: Path, serial: int) -> None:
    cert_pem, key_pem = self_signed(serial)
    (tmp_path / "c").write_bytes(cert_pem)
    (tmp_path / "k").write_bytes(key_pem)
    openssl = subprocess.run(
        ["openssl", "x509", "-in", str(tmp_path / "c"), "-noout", "-serial"], capture_output=True, text=True, check=True
    )
    ours = run_cli("check", "--cert", tmp_path / "c", "--key", tmp_path / "k")
    assert ours.returncode == EXIT_OK, ours.stderr
    fields = dict(line.split(":", 1) for line in ours.stdout.splitlines())
    assert openssl.stdout.strip() == f"serial={fields['serial'].strip()}", (openssl.stdout, ours.stdout)
