"""The connection to Temporal over mutual TLS, as a self-hosted mTLS cluster asks for it: the dev server
serves no TLS, so a TLS front on 127.0.0.1 (this test's, with certificates it makes with ``cryptography``)
terminates it in front of the session's dev server — requiring a client certificate of its CA — and the
worker and the client connect through ``client.connect`` with the ``TEMPORAL_TLS_*`` settings. A request
runs through it; a client without a certificate, one that does not trust the server's CA, and one that
expects another server name are refused."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import ipaddress
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from temporalio.client import Client

from client import Settings, connect

from .harness import Harness

pytestmark = pytest.mark.timeout(90)

SERVER_NAME = "temporal.test"


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def _write(path: Path, key: ec.EllipticCurvePrivateKey, cert: x509.Certificate) -> tuple[Path, Path]:
    cert_path, key_path = path.with_suffix(".crt"), path.with_suffix(".key")
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return cert_path, key_path


class Authority:
    """A CA, and the certificates it signs."""

    def __init__(self, directory: Path, name: str = "test CA") -> None:
        self.directory = directory
        self.key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        self.cert = (
            x509.CertificateBuilder()
            .subject_name(_name(name))
            .issuer_name(_name(name))
            .public_key(self.key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(True, False, False, False, False, True, True, False, False), critical=True)
            .sign(self.key, hashes.SHA256())
        )
        self.cert_path, _ = _write(directory / name.replace(" ", "-"), self.key, self.cert)

    def issue(self, name: str, *, server: bool) -> tuple[Path, Path]:
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        builder = (
            x509.CertificateBuilder()
            .subject_name(_name(name))
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(
                x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH]),
                critical=False,
            )
        )
        if server:
            builder = builder.add_extension(
                x509.SubjectAlternativeName([x509.DNSName(name), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                critical=False,
            )
        return _write(self.directory / name, key, builder.sign(self.key, hashes.SHA256()))


@contextlib.asynccontextmanager
async def mtls_front(target: str, authority: Authority) -> AsyncIterator[str]:
    """A TLS server on 127.0.0.1 that requires a client certificate of ``authority`` and passes the
    connection on to ``target`` (the dev server's gRPC port); yields its address."""
    server_cert, server_key = authority.issue(SERVER_NAME, server=True)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(server_cert, server_key)
    context.load_verify_locations(authority.cert_path)
    context.verify_mode = ssl.CERT_REQUIRED
    context.set_alpn_protocols(["h2"])
    host, _, port = target.rpartition(":")

    async def pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while chunk := await reader.read(65536):
                writer.write(chunk)
                await writer.drain()
        except (ConnectionError, ssl.SSLError):
            pass
        finally:
            writer.close()

    async def serve(client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        upstream_reader, upstream_writer = await asyncio.open_connection(host, int(port))
        await asyncio.gather(pump(client_reader, upstream_writer), pump(upstream_reader, client_writer))

    server = await asyncio.start_server(serve, "127.0.0.1", 0, ssl=context)
    address = f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
    try:
        yield address
    finally:
        server.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(server.wait_closed(), 2)


async def test_a_request_runs_over_mutual_tls_and_a_client_the_server_cannot_trust_is_refused(
    client: Client, tmp_path: Path
):
    authority = Authority(tmp_path)
    client_cert, client_key = authority.issue("agent-worker", server=False)
    async with mtls_front(client.service_client.config.target_host, authority) as address:
        env = {
            "TEMPORAL_ADDRESS": address,
            "TEMPORAL_NAMESPACE": client.namespace,
            "AGENT_STATE_DIR": str(tmp_path / "state"),
            "AGENT_TEMPORAL_WAIT_SECONDS": "0",
            "TEMPORAL_TLS_SERVER_CA_CERT_PATH": str(authority.cert_path),
            "TEMPORAL_TLS_CLIENT_CERT_PATH": str(client_cert),
            "TEMPORAL_TLS_CLIENT_KEY_PATH": str(client_key),
            "TEMPORAL_TLS_SERVER_NAME": SERVER_NAME,
            "TEMPORAL_API_KEY": "a-key-the-dev-server-ignores",
        }
        settings = Settings.from_env(env)
        secured = await connect(settings, tracing=False)
        async with Harness(secured, tmp_path) as h:  # the worker polls, and the client starts, over mTLS
            out = await h.run("What is the price of ACME?")
        assert out.failure is None and "ACME" in out.result.response

        stranger = Authority(tmp_path, "another CA")
        foreign_cert, foreign_key = stranger.issue("intruder", server=False)
        refused = {
            "no client certificate": {
                k: v for k, v in env.items() if not k.startswith(("TEMPORAL_TLS_CLIENT", "TEMPORAL_API_KEY"))
            },
            "a certificate of another CA": {
                **env,
                "TEMPORAL_TLS_CLIENT_CERT_PATH": str(foreign_cert),
                "TEMPORAL_TLS_CLIENT_KEY_PATH": str(foreign_key),
            },
            "a server it does not trust": {**env, "TEMPORAL_TLS_SERVER_CA_CERT_PATH": str(stranger.cert_path)},
            "another server name": {**env, "TEMPORAL_TLS_SERVER_NAME": "elsewhere.test"},
            "no TLS at all": {"TEMPORAL_ADDRESS": address, "AGENT_STATE_DIR": str(tmp_path / "state")},
        }
        for why, variables in refused.items():
            with pytest.raises(RuntimeError):
                rejected = await asyncio.wait_for(connect(Settings.from_env(variables), tracing=False), 30)
                await rejected.count_workflows()  # a lazy connection would fail here
                pytest.fail(f"connected with {why}")
