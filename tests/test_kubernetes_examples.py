"""examples/kubernetes: the manifests parse, are valid Kubernetes objects (checked offline against the schemas
kubernetes-validate ships), agree with each other and with cert-manager's Secret, their
commands are valid gunicorn/uvicorn/tlsreload command lines, and the gunicorn one really serves and reloads."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import trustme
import yaml
from gunicorn.config import KNOWN_SETTINGS, Config
from uvicorn.main import main as uvicorn_command

from tlsreload_plugins.cli import build_parser
from tlsreload_plugins.settings import resolve_expiry_warning_days, resolve_interval
from tlstest import HOST, KubeletLayout, client_context, free_port, issue, run_server, wait_for_serial, wait_until

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "kubernetes"
SECRET_KEYS = {"tls.crt", "tls.key", "ca.crt"}  # what cert-manager writes into a Certificate's Secret
EXPECTED_KINDS = {
    ("cert-manager.io/v1", "Issuer"),
    ("cert-manager.io/v1", "Certificate"),
    ("apps/v1", "Deployment"),
    ("v1", "Service"),
}
CERT_OPTION = {"gunicorn": "--certfile", "tlsreload-uvicorn": "--ssl-certfile"}
KEY_OPTION = {"gunicorn": "--keyfile", "tlsreload-uvicorn": "--ssl-keyfile"}


def load(name: str) -> list[dict[str, Any]]:
    docs = [doc for doc in yaml.safe_load_all((EXAMPLES / name).read_text()) if doc is not None]
    assert docs, name
    return docs


def all_docs() -> dict[str, list[dict[str, Any]]]:
    return {path.name: load(path.name) for path in sorted(EXAMPLES.glob("*.yaml"))}


def of_kind(kind: str) -> list[dict[str, Any]]:
    return [doc for docs in all_docs().values() for doc in docs if doc["kind"] == kind]


def duration_hours(text: str) -> float:
    assert text.endswith("h"), f"durations here are written in hours, got {text!r}"
    return float(text[:-1])


def serving_certificate() -> dict[str, Any]:
    (certificate,) = [c for c in of_kind("Certificate") if not c["spec"].get("isCA")]
    return certificate


def deployments() -> dict[str, dict[str, Any]]:
    return {name: load(name)[0] for name in ("deployment-gunicorn.yaml", "deployment-uvicorn.yaml")}


def container(deployment: dict[str, Any]) -> dict[str, Any]:
    (only,) = deployment["spec"]["template"]["spec"]["containers"]
    return only


def tls_mount(deployment: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The mount path of the volume holding the Certificate's Secret, and that volume."""
    secret = serving_certificate()["spec"]["secretName"]
    volumes = [v for v in deployment["spec"]["template"]["spec"]["volumes"] if v.get("secret")]
    matching = [v for v in volumes if v["secret"]["secretName"] == secret]
    assert len(matching) == 1, f"no volume (or several) mounts the Secret {secret!r} the Certificate writes"
    (volume,) = matching
    (mount,) = [m for m in container(deployment)["volumeMounts"] if m["name"] == volume["name"]]
    assert "subPath" not in mount, "kubelet never updates a subPath mount: rotations would not arrive"
    assert mount.get("readOnly") is True
    return mount["mountPath"], volume


def option(command: list[str], name: str) -> str:
    assert command.count(name) == 1, (name, command)
    return command[command.index(name) + 1]


def secret_file(deployment: dict[str, Any], path: str) -> str:
    """The Secret key that ``path`` inside the container reads."""
    mount_path, volume = tls_mount(deployment)
    assert path.startswith(mount_path.rstrip("/") + "/"), f"{path} is not under the Secret's mount {mount_path}"
    name = path[len(mount_path.rstrip("/")) + 1 :]
    items = {item["path"]: item["key"] for item in volume["secret"].get("items", [])}
    key = items.get(name, name) if items else name
    assert key in SECRET_KEYS, f"{path} reads {key!r}, which cert-manager does not write"
    return key


def test_every_manifest_parses_with_the_expected_api_versions() -> None:
    docs = all_docs()
    assert set(docs) == {"certificate.yaml", "service.yaml", "deployment-gunicorn.yaml", "deployment-uvicorn.yaml"}
    for name, manifests in docs.items():
        for doc in manifests:
            assert (doc["apiVersion"], doc["kind"]) in EXPECTED_KINDS, (name, doc["apiVersion"], doc["kind"])
            assert doc["metadata"]["name"]


def test_kubernetes_manifests_are_valid_against_the_kubernetes_schemas() -> None:
    """Every core/apps object, checked offline against the OpenAPI schemas kubernetes-validate ships, in strict
    mode (an unknown or misspelt field fails). cert-manager's own kinds have no schema there and are skipped."""
    version = kubernetes_validate.latest_version()
    checked = []
    for name, manifests in all_docs().items():
        for doc in manifests:
            if doc["apiVersion"].startswith("cert-manager.io/"):
                continue
            try:
                kubernetes_validate.validate(doc, version, strict=True)
            except kubernetes_validate.ValidationError as error:
                pytest.fail(
                    f"{name}: {doc['kind']} {doc['metadata']['name']} is not valid for Kubernetes {version}: {error}"
                )
            checked.append(doc["kind"])
    assert sorted(checked) == ["Deployment", "Deployment", "Service"]


def test_the_schema_check_catches_a_misspelt_field() -> None:
    (service,) = of_kind("Service")
    service["spec"]["selectr"] = service["spec"].pop("selector")
    with pytest.raises(kubernetes_validate.ValidationError, match="selectr"):
        kubernetes_validate.validate(service, kubernetes_validate.latest_version(), strict=True)


def test_issuers_certificates_and_secrets_connect() -> None:
    issuers = {issuer["metadata"]["name"]: issuer["spec"] for issuer in of_kind("Issuer")}
    certificates = of_kind("Certificate")
    for certificate in certificates:
        ref = certificate["spec"]["issuerRef"]
        assert ref["kind"] == "Issuer" and ref.get("group", "cert-manager.io") == "cert-manager.io"
        assert ref["name"] in issuers, f"{certificate['metadata']['name']} is issued by an Issuer not defined here"
    ca_secrets = {c["spec"]["secretName"] for c in certificates if c["spec"].get("isCA")}
    for spec in issuers.values():
        if "ca" in spec:
            assert spec["ca"]["secretName"] in ca_secrets

    serving = serving_certificate()["spec"]
    assert "server auth" in serving["usages"]
    assert duration_hours(serving["renewBefore"]) < duration_hours(serving["duration"])
    (service,) = of_kind("Service")
    assert service["metadata"]["name"] in serving["dnsNames"]


def test_deployments_mount_the_certificate_secret_and_point_the_server_at_it() -> None:
    (service,) = of_kind("Service")
    serving = serving_certificate()["spec"]
    for name, deployment in deployments().items():
        spec = deployment["spec"]
        labels = spec["template"]["metadata"]["labels"]
        assert spec["selector"]["matchLabels"].items() <= labels.items(), name
        assert service["spec"]["selector"].items() <= labels.items(), name
        app = container(deployment)
        command = app["command"]
        assert secret_file(deployment, option(command, CERT_OPTION[command[0]])) == "tls.crt", name
        assert secret_file(deployment, option(command, KEY_OPTION[command[0]])) == "tls.key", name

        env = {item["name"]: item["value"] for item in app["env"]}
        assert resolve_interval(float(env["TLSRELOAD_INTERVAL"])) > 0
        # A warning window wider than the time cert-manager leaves before expiry would warn every day.
        warn_days = resolve_expiry_warning_days(float(env["TLSRELOAD_EXPIRY_WARNING_DAYS"]))
        assert warn_days * 24 < duration_hours(serving["renewBefore"]), name

        (port,) = app["ports"]
        (service_port,) = service["spec"]["ports"]
        assert service_port["targetPort"] == port["name"], name
        assert app["livenessProbe"]["tcpSocket"]["port"] == port["name"], name
        if command[0] == "gunicorn":
            assert option(command, "--bind") == f"0.0.0.0:{port['containerPort']}", name
        else:
            assert option(command, "--port") == str(port["containerPort"]), name


def test_probe_is_a_valid_tlsreload_check_of_the_mounted_files() -> None:
    for name, deployment in deployments().items():
        probe = container(deployment)["readinessProbe"]["exec"]["command"]
        assert probe[:2] == ["tlsreload", "check"], name
        args = build_parser().parse_args(probe[1:])
        assert secret_file(deployment, args.cert) == "tls.crt", name
        assert secret_file(deployment, args.key) == "tls.key", name
        if args.ca:
            assert secret_file(deployment, args.ca) == "ca.crt", name
        assert "livenessProbe" not in container(deployment) or "exec" not in container(deployment)["livenessProbe"]


def test_gunicorn_command_is_valid_for_gunicorn() -> None:
    command = container(deployments()["deployment-gunicorn.yaml"])["command"]
    assert command[0] == "gunicorn"
    known = {flag for setting in KNOWN_SETTINGS for flag in (setting.cli or [])}
    flags = [arg.split("=", 1)[0] for arg in command[1:] if arg.startswith("-")]
    assert set(flags) <= known, set(flags) - known
    config_module = option(command, "-c")
    assert config_module.startswith("python:")
    assert importlib.util.find_spec(config_module.removeprefix("python:")) is not None
    # gunicorn's own parser and validators, as `gunicorn` runs them on this command line.
    config = Config()
    parsed = config.parser().parse_args(command[1:])
    for key, value in vars(parsed).items():
        if value is not None and key != "args" and key in config.settings:
            config.set(key, value)
    assert parsed.args == ["myapp.wsgi:application"]
    assert config.certfile == "/etc/tls/tls.crt" and config.is_ssl


def test_uvicorn_command_is_valid_for_uvicorn() -> None:
    command = container(deployments()["deployment-uvicorn.yaml"])["command"]
    assert command[0] == "tlsreload-uvicorn"
    # tlsreload-uvicorn takes uvicorn's command line: uvicorn's own parser must accept it.
    context = uvicorn_command.make_context("uvicorn", list(command[1:]))
    assert context.params["app"] == "myapp.asgi:app"
    assert context.params["ssl_certfile"] == "/etc/tls/tls.crt"
    assert context.params["ssl_keyfile"] == "/etc/tls/tls.key"


@dataclass
class SecretVolume:
    layout: KubeletLayout
    serial: str

    def rotate(self, ca: trustme.CA) -> str:
        pair = issue(ca, "myapp.default.svc", "localhost")
        self.layout.write_files({"tls.crt": pair.chain, "tls.key": pair.key, "ca.crt": ca.cert_pem.bytes()})
        self.serial = pair.serial
        return pair.serial

    def localise(self, args: list[str]) -> list[str]:
        """A container's command line with /etc/tls pointing at this volume."""
        return [arg.replace("/etc/tls", str(self.layout.root)) for arg in args]


@pytest.fixture
def secret_volume(tmp_path: Path, ca: trustme.CA) -> SecretVolume:
    volume = SecretVolume(KubeletLayout(tmp_path / "etc-tls"), "")
    volume.rotate(ca)
    return volume


def runnable_here(command: list[str], port: int) -> list[str]:
    """A container command made to run on this machine: 127.0.0.1, a free port, the demo app for ``myapp``."""
    if command[0] == "gunicorn":
        command = [sys.executable, "-m", "gunicorn", *command[1:]]
        command[command.index("--bind") + 1] = f"{HOST}:{port}"
        command[-1] = "tlsreload_plugins.demo.app:wsgi"
        # Not in the manifest (one arbiter per container there): tests run several arbiters per user, and
        # gunicorn >= 25.1 gives every arbiter of a user the same control socket path.
        if any(setting.name == "control_socket_disable" for setting in KNOWN_SETTINGS):
            command.append("--no-control-socket")
        return command
    assert command[0] == "tlsreload-uvicorn"
    command = [str(Path(sys.executable).with_name("tlsreload-uvicorn")), *command[1:]]
    command[command.index("--host") + 1] = HOST
    command[command.index("--port") + 1] = str(port)
    command[command.index("myapp.asgi:app")] = "tlsreload_plugins.demo.app:asgi"
    return command


@pytest.mark.parametrize("manifest", ["deployment-gunicorn.yaml", "deployment-uvicorn.yaml"])
def test_the_container_command_serves_and_reloads(
    manifest: str, tmp_path: Path, ca: trustme.CA, secret_volume: SecretVolume
) -> None:
    app = container(deployments()[manifest])
    port = free_port()
    command = runnable_here(secret_volume.localise(app["command"]), port)
    env = {item["name"]: item["value"] for item in app["env"]}

    probe = secret_volume.localise(app["readinessProbe"]["exec"]["command"])
    probe[0] = str(Path(sys.executable).with_name("tlsreload"))
    result = subprocess.run(probe, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr

    ctx = client_context(ca)
    with run_server(command, tmp_path / "server.log", port, env) as server:
        wait_for_serial(port, ctx, secret_volume.serial, timeout=60)
        wait_for_serial(port, ctx, secret_volume.rotate(ca), timeout=60)
        wait_until(lambda: f"-> {secret_volume.serial}" in server.output(), 30, what="the reload log line")
