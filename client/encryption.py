"""Payload encryption at rest: an AES-256-GCM ``PayloadCodec`` shared by every process of a deployment.

With ``AGENT_ENCRYPTION_KEYS_FILE`` (or ``AGENT_ENCRYPTION_KEYS``) set, the worker, ``AgentClient``, the
CLI and the codec server build their data converter with :class:`EncryptionCodec`: every payload they
send Temporal — a request, a plan, a tool's arguments and result, an answer, a signal, a query's answer, a
failure's message (``workflows.converter.EncryptingFailureConverter``) — is encrypted before it leaves
the process, and so is every payload kept by reference in the payload store (the SDK encodes a payload
before it stores it). Temporal, its database and the payload store hold ciphertext only. A payload keeps
its encoding in the ciphertext; outside it says ``encoding: binary/encrypted`` and the id of its key
(``encryption-key-id``).

Not encrypted: what the Temporal UI must show without a codec — payloads built as
``workflows.converter.Shown`` (summaries, details, the current details; ``workflows.story`` keeps request
text out of them unless ``AGENT_UI_SHOWS_TEXT`` allows it) — and search attributes, which hold stage
names and kinds.

Keys: one per line, ``<key id>=<base64 of 32 random bytes>`` (``agent-lifecycle encryption-key`` prints
a new line), ``#`` comments and blank lines ignored. The first key encrypts; every key listed decrypts.
Rotation: put a new key first and keep the old ones below it until nothing written with them is kept any
longer (histories past their retention, payload-store entries past theirs). A payload whose key id is not
listed is a :class:`UnknownEncryptionKey` naming that id; one that does not decrypt (altered, or another
key under the same id) a :class:`PayloadDecryptionError`. Payloads written before encryption was turned
on still decode.
"""

from __future__ import annotations

import base64
import binascii
import os
import re
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from temporalio.api.common.v1 import Payload
from temporalio.converter import PayloadCodec

from workflows.converter import BY_REFERENCE_METADATA, ENCRYPTED_ENCODING, KEY_ID_METADATA, SHOWN_METADATA

ENCODING = ENCRYPTED_ENCODING
KEY_BYTES = 32
NONCE_BYTES = 12
_KEY_ID = re.compile(r"[A-Za-z0-9._-]{1,64}")
# Bound into every ciphertext with its key id: a ciphertext moved under another id does not decrypt.
_ASSOCIATED = b"agent-lifecycle payload v1:"


class EncryptionKeyError(ValueError):
    """Keys that cannot be used: a malformed line, a key that is not 32 bytes, an id listed twice, none at
    all. The message names the line, never a key."""


class UnknownEncryptionKey(LookupError):
    """A payload encrypted with a key this process does not have: ``key_id`` names it."""

    def __init__(self, key_id: str) -> None:
        self.key_id = key_id
        super().__init__(
            f"a payload is encrypted with key {key_id!r}, which this process does not have: list it in "
            "AGENT_ENCRYPTION_KEYS_FILE (or AGENT_ENCRYPTION_KEYS) to read it"
        )


class PayloadDecryptionError(ValueError):
    """A payload that does not decrypt with the key its id names: altered, or another key under that id."""

    def __init__(self, key_id: str, reason: str = "altered, or encrypted with another key of that id") -> None:
        self.key_id = key_id
        super().__init__(f"a payload encrypted with key {key_id!r} does not decrypt with it ({reason})")


@dataclass(frozen=True)
class Keyring:
    """Keys by id, in the order listed: the first encrypts, every one decrypts."""

    keys: Mapping[str, bytes] = field(repr=False)

    def __post_init__(self) -> None:
        if not self.keys:
            raise EncryptionKeyError("no encryption key is listed")

    @property
    def active(self) -> str:
        """The id of the key that encrypts."""
        return next(iter(self.keys))

    @classmethod
    def parse(cls, text: str, *, where: str = "") -> Keyring:
        """Keys from ``<id>=<base64 key>`` entries, one per line (or comma-separated), the first encrypting;
        ``where`` heads each error (a file's path)."""
        at = f"{where}: " if where else ""
        keys: dict[str, bytes] = {}
        for number, line in enumerate(re.split(r"[\n,]", text), start=1):
            entry = line.split("#", 1)[0].strip()
            if not entry:
                continue
            key_id, sep, encoded = (part.strip() for part in entry.partition("="))
            if not sep or not _KEY_ID.fullmatch(key_id):
                raise EncryptionKeyError(
                    f"{at}entry {number} is not <key id>=<base64 key> (an id of letters, digits, '.', '_', '-')"
                )
            try:
                key = base64.b64decode(encoded, validate=True)
            except (binascii.Error, ValueError):
                raise EncryptionKeyError(f"{at}key {key_id!r} is not base64") from None
            if len(key) != KEY_BYTES:
                raise EncryptionKeyError(f"{at}key {key_id!r} is {len(key)} bytes, not {KEY_BYTES} (AES-256)")
            if key_id in keys:
                raise EncryptionKeyError(f"{at}key {key_id!r} is listed twice")
            keys[key_id] = key
        if not keys:
            raise EncryptionKeyError(f"{at}no key is listed")
        return cls(keys)

    @classmethod
    def from_file(cls, path: Path) -> Keyring:
        try:
            text = path.read_text()
        except OSError as err:
            raise EncryptionKeyError(f"cannot read {path}: {err.strerror or err}") from None
        return cls.parse(text, where=str(path))


def new_key_line(key_id: str | None = None) -> str:
    """A new line for a keys file: a fresh random key under ``key_id`` (default: today's date)."""
    key_id = key_id or datetime.now(UTC).strftime("k%Y%m%d")
    if not _KEY_ID.fullmatch(key_id):
        raise EncryptionKeyError(f"{key_id!r} is not a key id (letters, digits, '.', '_', '-')")
    return f"{key_id}={base64.b64encode(secrets.token_bytes(KEY_BYTES)).decode()}"


class EncryptionCodec(PayloadCodec):
    """AES-256-GCM over each whole payload (its metadata and data), with a fresh 96-bit nonce per payload.

    The encrypted payload's own metadata says only its encoding, its key id, and whether the payload store
    may take it by reference (``agent-by-reference``: no content). A payload marked as shown by the UI
    (``agent-shown``) is left as it is."""

    def __init__(self, keyring: Keyring) -> None:
        self.keyring = keyring
        self._ciphers = {key_id: AESGCM(key) for key_id, key in keyring.keys.items()}

    async def encode(self, payloads: Sequence[Payload]) -> list[Payload]:
        return [self.encrypt(p) for p in payloads]

    async def decode(self, payloads: Sequence[Payload]) -> list[Payload]:
        return [self.decrypt(p) for p in payloads]

    def encrypt(self, payload: Payload) -> Payload:
        if payload.metadata.get(SHOWN_METADATA) == b"true":
            return payload
        key_id = self.keyring.active
        nonce = os.urandom(NONCE_BYTES)
        sealed = self._ciphers[key_id].encrypt(
            nonce, payload.SerializeToString(deterministic=True), _ASSOCIATED + key_id.encode()
        )
        encrypted = Payload(metadata={"encoding": ENCODING, KEY_ID_METADATA: key_id.encode()}, data=nonce + sealed)
        placement = payload.metadata.get(BY_REFERENCE_METADATA)
        if placement is not None:
            encrypted.metadata[BY_REFERENCE_METADATA] = placement
        return encrypted

    def decrypt(self, payload: Payload) -> Payload:
        if payload.metadata.get("encoding") != ENCODING:
            return payload  # written before encryption was on, or shown in the UI
        key_id = payload.metadata.get(KEY_ID_METADATA, b"").decode("utf-8", "replace")
        cipher = self._ciphers.get(key_id)
        if cipher is None:
            raise UnknownEncryptionKey(key_id)
        if len(payload.data) < NONCE_BYTES + 16:
            raise PayloadDecryptionError(key_id, "too short to be a ciphertext")
        try:
            plain = cipher.decrypt(
                payload.data[:NONCE_BYTES], payload.data[NONCE_BYTES:], _ASSOCIATED + key_id.encode()
            )
        except InvalidTag:
            raise PayloadDecryptionError(key_id) from None
        return Payload.FromString(plain)


def encrypted(payload: Payload) -> bool:
    """Whether ``payload`` is one :class:`EncryptionCodec` encrypted."""
    return payload.metadata.get("encoding") == ENCODING


SEALED_PREFIX = "enc:v1:"


class Sealer:
    """Text sealed with the keyring for a store (``enc:v1:<key id>:<base64 nonce + ciphertext>``), bound to
    what it is (``purpose``): a sealed record does not open as a cached answer."""

    def __init__(self, keyring: Keyring, purpose: str) -> None:
        self.keyring = keyring
        self._associated = f"agent-lifecycle store v1:{purpose}:".encode()
        self._ciphers = {key_id: AESGCM(key) for key_id, key in keyring.keys.items()}

    def seal(self, text: str) -> str:
        key_id = self.keyring.active
        nonce = os.urandom(NONCE_BYTES)
        sealed = self._ciphers[key_id].encrypt(nonce, text.encode(), self._associated + key_id.encode())
        return f"{SEALED_PREFIX}{key_id}:{base64.b64encode(nonce + sealed).decode()}"

    def open(self, sealed: str) -> str:
        """The text of a sealed value; a value that is not sealed is returned as it is (written before
        encryption was on)."""
        if not sealed.startswith(SEALED_PREFIX):
            return sealed
        key_id, _, encoded = sealed.removeprefix(SEALED_PREFIX).partition(":")
        cipher = self._ciphers.get(key_id)
        if cipher is None:
            raise UnknownEncryptionKey(key_id)
        try:
            raw = base64.b64decode(encoded, validate=True)
            return cipher.decrypt(raw[:NONCE_BYTES], raw[NONCE_BYTES:], self._associated + key_id.encode()).decode()
        except (InvalidTag, binascii.Error, ValueError):
            raise PayloadDecryptionError(key_id) from None
