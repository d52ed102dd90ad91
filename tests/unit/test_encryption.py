"""The payload codec and the settings that turn protection on: every payload is AES-256-GCM ciphertext
under the key that encrypts, every listed key decrypts, a payload of an unknown key is an error naming it,
a changed byte does not decrypt, and only what the UI must show without a codec stays readable. TLS and
API-key settings become the connect arguments the SDK takes, and a bad one stops the process by name."""

from __future__ import annotations

import base64
import os
import stat

import pytest
from temporalio.api.common.v1 import Payload
from temporalio.service import TLSConfig

from client import Settings, connect_options, process_data_converter
from client.encryption import (
    ENCODING,
    KEY_ID_METADATA,
    EncryptionCodec,
    EncryptionKeyError,
    Keyring,
    PayloadDecryptionError,
    UnknownEncryptionKey,
    new_key_line,
)
from client.settings import SettingsError
from storage import sqlite
from workflows.converter import (
    BY_REFERENCE_METADATA,
    EncryptedPayloadError,
    EncryptingFailureConverter,
    Shown,
    data_converter,
)

MARKER = "4111 1111 1111 1111 marker-7f3a"


def key(n: int) -> str:
    return base64.b64encode(bytes([n]) * 32).decode()


def plain(text: str = MARKER) -> Payload:
    return data_converter.payload_converter.to_payload({"request": text})


def codec(*entries: str) -> EncryptionCodec:
    return EncryptionCodec(Keyring.parse("\n".join(entries)))


async def test_a_payload_is_ciphertext_under_the_first_key_and_decrypts_as_it_was():
    c = codec(f"k2={key(2)}", f"k1={key(1)}")
    [sealed] = await c.encode([plain()])
    assert sealed.metadata["encoding"] == ENCODING and sealed.metadata[KEY_ID_METADATA] == b"k2"
    assert MARKER.encode() not in sealed.SerializeToString() and b"json/plain" not in sealed.SerializeToString()
    assert await c.decode([sealed]) == [plain()]
    [again] = await c.encode([plain()])
    assert again.data != sealed.data  # a fresh nonce each time


async def test_rotation_every_listed_key_decrypts_and_the_first_encrypts():
    old = codec(f"k1={key(1)}")
    [written_before] = await old.encode([plain()])
    rotated = codec(f"k2={key(2)}", f"k1={key(1)}")
    assert await rotated.decode([written_before]) == [plain()]
    [written_after] = await rotated.encode([plain()])
    assert written_after.metadata[KEY_ID_METADATA] == b"k2"
    with pytest.raises(UnknownEncryptionKey, match="'k2'") as raised:
        await old.decode([written_after])
    assert raised.value.key_id == "k2"


async def test_a_process_without_keys_is_told_which_key_it_lacks_and_never_takes_it_for_bad_input():
    [sealed] = await codec(f"k3={key(3)}").encode([plain()])
    for hint in (None, dict):  # untyped (a workflow's own entry point) or typed: the same error, no RawValue
        with pytest.raises(EncryptedPayloadError, match="'k3'") as raised:
            data_converter.payload_converter.from_payloads([sealed], [hint] if hint else None)
        assert raised.value.key_id == "k3"


async def test_a_changed_byte_or_a_key_moved_under_another_id_does_not_decrypt():
    c = codec(f"k1={key(1)}", f"k9={key(1)}")
    [sealed] = await c.encode([plain()])
    tampered = Payload()
    tampered.CopyFrom(sealed)
    tampered.data = sealed.data[:-1] + bytes([sealed.data[-1] ^ 1])
    with pytest.raises(PayloadDecryptionError, match="'k1'"):
        await c.decode([tampered])
    moved = Payload()
    moved.CopyFrom(sealed)
    moved.metadata[KEY_ID_METADATA] = b"k9"  # the same key bytes, but the id is bound into the ciphertext
    with pytest.raises(PayloadDecryptionError, match="'k9'"):
        await c.decode([moved])
    short = Payload(metadata={"encoding": ENCODING, KEY_ID_METADATA: b"k1"}, data=b"x")
    with pytest.raises(PayloadDecryptionError):
        await c.decode([short])


async def test_what_the_ui_shows_stays_readable_and_what_was_written_before_decodes():
    c = codec(f"k1={key(1)}")
    summary = data_converter.payload_converter.to_payload(Shown("request · r-1"))
    [kept] = await c.encode([summary])
    assert kept == summary
    assert await c.decode([plain()]) == [plain()]  # written before encryption was on


async def test_the_payload_store_still_sees_which_payloads_it_may_take():
    c = codec(f"k1={key(1)}")
    marked = plain()
    marked.metadata[BY_REFERENCE_METADATA] = b"reference"
    [sealed] = await c.encode([marked])
    assert sealed.metadata[BY_REFERENCE_METADATA] == b"reference"
    assert await c.decode([sealed]) == [marked]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "no key is listed"),
        ("# only a comment\n", "no key is listed"),
        ("k1", "entry 1 is not <key id>=<base64 key>"),
        ("bad id=" + key(1), "not <key id>"),
        ("k1=not-base64!", "not base64"),
        ("k1=" + base64.b64encode(b"short").decode(), "5 bytes, not 32"),
        (f"k1={key(1)}\nk1={key(2)}", "listed twice"),
    ],
)
def test_keys_that_cannot_be_used_are_refused_without_showing_them(text, message):
    with pytest.raises(EncryptionKeyError, match=message) as raised:
        Keyring.parse(text)
    assert key(1) not in str(raised.value) and key(2) not in str(raised.value)


def test_a_new_key_line_parses():
    line = new_key_line("k7")
    assert Keyring.parse(line).active == "k7"
    assert Keyring.parse(f"# rotated\n{new_key_line('k8')}\n{line}\n").active == "k8"


def test_the_settings_turn_encryption_on_and_name_a_bad_keys_file(tmp_path):
    keys = tmp_path / "keys"
    keys.write_text(f"k1={key(1)}\n")
    settings = Settings.from_env({"AGENT_ENCRYPTION_KEYS_FILE": str(keys), "AGENT_STATE_DIR": str(tmp_path)})
    assert settings.protection.encrypts and not settings.protection.shows_text
    converter = process_data_converter(settings)
    assert isinstance(converter.payload_codec, EncryptionCodec)
    assert converter.failure_converter_class is EncryptingFailureConverter
    assert Settings.from_env({"AGENT_ENCRYPTION_KEYS": f"k1={key(1)},k0={key(0)}"}).protection.keyring().active == "k1"  # type: ignore[union-attr]
    assert Settings.from_env({}).protection.shows_text and process_data_converter(Settings()).payload_codec is None

    keys.write_text("k1=" + base64.b64encode(b"short").decode())
    with pytest.raises(SettingsError) as raised:
        Settings.from_env({"AGENT_ENCRYPTION_KEYS_FILE": str(keys)})
    assert raised.value.variables == ["AGENT_ENCRYPTION_KEYS_FILE"] and "not 32" in str(raised.value)
    with pytest.raises(SettingsError, match="AGENT_ENCRYPTION_KEYS: .*not base64") as secret:
        Settings.from_env({"AGENT_ENCRYPTION_KEYS": "k1=!!!!"})
    assert "!!!!" not in str(secret.value)
    keys.write_text(f"k1={key(1)}\n")
    with pytest.raises(SettingsError, match="not both"):
        Settings.from_env({"AGENT_ENCRYPTION_KEYS_FILE": str(keys), "AGENT_ENCRYPTION_KEYS": f"k2={key(2)}"})
    with pytest.raises(SettingsError, match="is not a file"):
        Settings.from_env({"AGENT_ENCRYPTION_KEYS_FILE": str(tmp_path / "missing")})


def test_tls_and_api_key_settings_become_the_connect_arguments(tmp_path):
    for name in ("ca.pem", "cert.pem", "key.pem"):
        (tmp_path / name).write_bytes(f"-----{name}-----".encode())
    mtls = Settings.from_env(
        {
            "TEMPORAL_TLS_SERVER_CA_CERT_PATH": str(tmp_path / "ca.pem"),
            "TEMPORAL_TLS_CLIENT_CERT_PATH": str(tmp_path / "cert.pem"),
            "TEMPORAL_TLS_CLIENT_KEY_PATH": str(tmp_path / "key.pem"),
            "TEMPORAL_TLS_SERVER_NAME": "temporal.internal",
        }
    )
    options = connect_options(mtls)
    assert options["api_key"] is None
    assert options["tls"] == TLSConfig(
        server_root_ca_cert=b"-----ca.pem-----",
        domain="temporal.internal",
        client_cert=b"-----cert.pem-----",
        client_private_key=b"-----key.pem-----",
    )
    cloud = Settings.from_env({"TEMPORAL_API_KEY": "ak-secret"})
    assert connect_options(cloud) == {"tls": True, "api_key": "ak-secret"}  # an API key implies TLS
    assert connect_options(Settings.from_env({"TEMPORAL_API_KEY": "ak", "TEMPORAL_TLS": "false"}))["tls"] is False
    assert connect_options(Settings.from_env({"TEMPORAL_TLS": "true"})) == {"tls": True, "api_key": None}
    assert connect_options(Settings.from_env({})) == {"tls": False, "api_key": None}
    assert "ak-secret" not in repr(cloud)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"TEMPORAL_TLS_CLIENT_CERT_PATH": "cert.pem"}, "go together"),
        ({"TEMPORAL_TLS_CLIENT_KEY_PATH": "key.pem"}, "go together"),
        ({"TEMPORAL_TLS": "false", "TEMPORAL_TLS_SERVER_CA_CERT_PATH": "ca.pem"}, "TEMPORAL_TLS is false"),
        ({"TEMPORAL_TLS_SERVER_CA_CERT_PATH": "missing.pem"}, "is not a file"),
        ({"TEMPORAL_TLS": "maybe"}, "TEMPORAL_TLS"),
    ],
)
def test_tls_settings_that_do_not_fit_together_stop_the_process(tmp_path, monkeypatch, env, message):
    monkeypatch.chdir(tmp_path)
    for name in ("ca.pem", "cert.pem", "key.pem"):
        (tmp_path / name).write_text("pem")
    with pytest.raises(SettingsError, match=message):
        Settings.from_env(env)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"AGENT_CODEC_TOKEN": "short"}, "at least 32"),
        ({"AGENT_CODEC_ALLOWED_ORIGINS": "*"}, "no wildcard"),
        ({"AGENT_CODEC_ALLOWED_ORIGINS": "https://ui.example/path"}, "not an origin"),
        ({"AGENT_CODEC_ALLOWED_HOSTS": "bad host!"}, "not a host"),
        ({"AGENT_CODEC_MAX_BODY_BYTES": "10"}, "AGENT_CODEC_MAX_BODY_BYTES"),
    ],
)
def test_codec_server_settings_that_would_open_it_are_refused(env, message):
    with pytest.raises(SettingsError, match=message):
        Settings.from_env(env)


def test_a_jwks_needs_its_audience_and_issuer(tmp_path):
    from ..jwt_tokens import IdentityProvider

    jwks = IdentityProvider().write_jwks(tmp_path / "jwks.json")
    with pytest.raises(SettingsError, match="AGENT_CODEC_JWT_AUDIENCE and AGENT_CODEC_JWT_ISSUER"):
        Settings.from_env({"AGENT_CODEC_JWKS_FILE": str(jwks)})
    ok = Settings.from_env(
        {"AGENT_CODEC_JWKS_FILE": str(jwks), "AGENT_CODEC_JWT_AUDIENCE": "ui", "AGENT_CODEC_JWT_ISSUER": "https://i"}
    )
    assert ok.codec_server.jwks_file == jwks


def test_a_store_file_and_its_directory_are_created_for_their_owner_alone(tmp_path):
    path = tmp_path / "state" / "store.sqlite3"
    with sqlite.connection(path) as db:
        db.execute("CREATE TABLE t (x)")
        db.execute("INSERT INTO t VALUES (1)")
        for name in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
            assert stat.S_IMODE(os.stat(name).st_mode) == 0o600, name
    assert stat.S_IMODE(os.stat(path.parent).st_mode) == 0o700
    with open(tmp_path / "state" / "journal.jsonl", "a+", opener=sqlite.private_opener) as f:
        f.write("{}\n")
    assert stat.S_IMODE(os.stat(tmp_path / "state" / "journal.jsonl").st_mode) == 0o600
