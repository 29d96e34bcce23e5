"""Certificates and keys for the local control plane: one CA, serving and client certificates, the
service-account signing key pair, and kubeconfig files that embed them.

Kubernetes authenticates client certificates by subject: CN is the user name and O the groups, so each
component gets its own identity (``system:kube-controller-manager``, ``system:node:<name>`` ...) and RBAC
and the Node authorizer see what they would see in a real cluster.
"""

from __future__ import annotations

import base64
import datetime as dt
import ipaddress
from pathlib import Path

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_VALIDITY = dt.timedelta(days=365)


def _write_key(path: Path, key: rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.TraditionalOpenSSL,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)


def _name(cn: str, orgs: tuple[str, ...] = ()) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in orgs]
    attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, cn))
    return x509.Name(attrs)


class CA:
    """A self-signed CA kept on disk as <stem>.crt / <stem>.key."""

    def __init__(self, directory: Path, stem: str = "ca", cn: str = "localkube-ca") -> None:
        self.dir = directory
        self.cn = cn
        self.cert_path = directory / f"{stem}.crt"
        self.key_path = directory / f"{stem}.key"
        if not self.cert_path.exists():
            self._create()
        self.cert = x509.load_pem_x509_certificate(self.cert_path.read_bytes())
        key = serialization.load_pem_private_key(self.key_path.read_bytes(), None)
        assert isinstance(key, ec.EllipticCurvePrivateKey)
        self.key = key

    def _create(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        key = ec.generate_private_key(ec.SECP256R1())
        now = dt.datetime.now(dt.UTC)
        name = _name(self.cn)
        cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + _VALIDITY * 5)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256())
        )
        _write_key(self.key_path, key)
        self.cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))

    def issue(
        self,
        stem: str,
        cn: str,
        orgs: tuple[str, ...] = (),
        *,
        server: bool = False,
        client: bool = False,
        dns: tuple[str, ...] = (),
        ips: tuple[str, ...] = (),
    ) -> tuple[Path, Path]:
        """Write <stem>.crt and <stem>.key signed by this CA (kept if already present)."""
        crt, keyp = self.dir / f"{stem}.crt", self.dir / f"{stem}.key"
        if crt.exists() and keyp.exists():
            return crt, keyp
        key = ec.generate_private_key(ec.SECP256R1())
        now = dt.datetime.now(dt.UTC)
        usages = []
        if server:
            usages.append(ExtendedKeyUsageOID.SERVER_AUTH)
        if client:
            usages.append(ExtendedKeyUsageOID.CLIENT_AUTH)
        builder = (
            x509.CertificateBuilder()
            .subject_name(_name(cn, orgs))
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + _VALIDITY)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key()), critical=False)
        )
        sans: list[x509.GeneralName] = [x509.DNSName(d) for d in dns]
        sans += [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        cert = builder.sign(self.key, hashes.SHA256())
        _write_key(keyp, key)
        crt.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        return crt, keyp


def service_account_keys(directory: Path) -> tuple[Path, Path]:
    """The RSA pair the apiserver signs service-account tokens with (sa.key) and verifies them by (sa.pub)."""
    priv, pub = directory / "sa.key", directory / "sa.pub"
    if not priv.exists():
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        _write_key(priv, key)
        pub.write_bytes(
            key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        )
    return priv, pub


def write_kubeconfig(path: Path, server: str, ca: Path, cert: Path, key: Path, user: str) -> Path:
    """A self-contained kubeconfig (certificates embedded) for one identity."""

    def b64(p: Path) -> str:
        return base64.b64encode(p.read_bytes()).decode()

    cfg = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "localkube", "cluster": {"server": server, "certificate-authority-data": b64(ca)}}],
        "users": [{"name": user, "user": {"client-certificate-data": b64(cert), "client-key-data": b64(key)}}],
        "contexts": [{"name": "localkube", "context": {"cluster": "localkube", "user": user}}],
        "current-context": "localkube",
        "preferences": {},
    }
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    path.chmod(0o600)
    return path
