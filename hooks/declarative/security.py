"""Security primitives of declared hooks: SSRF address checks and AES-256-GCM secrets.

An HTTP or prompt hook's URL is resolved, every resolved address is checked, and the request is sent to
the checked address (pinned), so a DNS answer that changes between check and connect cannot redirect it
to an internal service. Loopback is refused unless explicitly allowed (tests do; production should not).
"""

from __future__ import annotations

import asyncio
import base64
import ipaddress
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from .config import ENCRYPTED_PREFIX

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
_SHARED_ADDRESS_SPACE = ipaddress.ip_network("100.64.0.0/10")  # carrier-grade NAT (RFC 6598)
NONCE_BYTES = 12


class BlockedAddress(Exception):
    """A URL resolves to an address a hook may not reach."""


def address_problem(address: str | IPAddress, *, allow_loopback: bool = False) -> str | None:
    """Why a hook may not connect to ``address`` (``loopback``, ``private``, ...), or ``None``.

    IPv4-mapped IPv6 (``::ffff:10.0.0.1``), 6to4 and Teredo forms are judged by the IPv4 address they
    carry, so an IPv6 spelling never reaches what its IPv4 form could not.
    """
    ip = ipaddress.ip_address(address) if isinstance(address, str) else address
    if isinstance(ip, ipaddress.IPv6Address):
        embedded = ip.ipv4_mapped or ip.sixtofour or (ip.teredo[1] if ip.teredo else None)
        if embedded is not None:
            ip = embedded
    if ip.is_loopback:
        return None if allow_loopback else "loopback"
    if ip.is_unspecified:
        return "unspecified"
    if ip.is_link_local:
        return "link_local"
    if ip.is_multicast:
        return "multicast"
    if isinstance(ip, ipaddress.IPv4Address) and ip in _SHARED_ADDRESS_SPACE:
        return "shared_address_space"
    if ip.is_private:
        return "private"
    if ip.is_reserved:
        return "reserved"
    if not ip.is_global:
        return "non_global"
    return None


@dataclass(frozen=True)
class ResolvedTarget:
    host: str  # as written in the URL (for the Host header and TLS server name)
    address: str  # the checked address the connection is pinned to
    port: int


async def resolve_target(host: str, port: int, *, allow_loopback: bool = False) -> ResolvedTarget:
    """Resolve ``host`` and check every address it resolves to; pin the first.

    Raises:
        BlockedAddress: when any resolved address is refused, or the host does not resolve.
    """
    try:
        literal = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        literal = None
    if literal is not None:
        addresses = [literal]
    else:
        try:
            infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except OSError as err:
            raise BlockedAddress(f"{host} does not resolve: {err}") from None
        addresses = list(dict.fromkeys(ipaddress.ip_address(str(info[4][0]).split("%", 1)[0]) for info in infos))
        if not addresses:
            raise BlockedAddress(f"{host} does not resolve")
    for ip in addresses:
        problem = address_problem(ip, allow_loopback=allow_loopback)
        if problem:
            raise BlockedAddress(f"{host} resolves to {ip}, a {problem} address hooks may not reach")
    return ResolvedTarget(host=host, address=str(addresses[0]), port=port)


class SecretBox:
    """AES-256-GCM with a key from configuration (``AGENT_HOOK_SECRET_KEY``: 32 bytes, base64).

    ``seal``/``open`` carry the nonce beside the ciphertext; ``aad`` binds a ciphertext to its row or
    header so it cannot be moved to another.
    """

    def __init__(self, key: bytes) -> None:
        if len(key) != 32:
            raise ValueError("the hook secret key must be 32 bytes (AES-256)")
        self._aead = AESGCM(key)

    @classmethod
    def from_base64(cls, text: str) -> SecretBox:
        try:
            key = base64.urlsafe_b64decode(text.strip() + "=" * (-len(text.strip()) % 4))
        except ValueError as err:
            raise ValueError(f"the hook secret key is not base64: {err}") from None
        return cls(key)

    @staticmethod
    def generate_key() -> str:
        return base64.urlsafe_b64encode(AESGCM.generate_key(bit_length=256)).decode()

    def seal(self, plaintext: bytes, aad: bytes | None = None) -> tuple[bytes, bytes]:
        """(nonce, ciphertext-with-tag)."""
        nonce = os.urandom(NONCE_BYTES)
        return nonce, self._aead.encrypt(nonce, plaintext, aad)

    def open(self, nonce: bytes, ciphertext: bytes, aad: bytes | None = None) -> bytes:
        try:
            return self._aead.decrypt(nonce, ciphertext, aad)
        except InvalidTag:
            raise ValueError("secret does not decrypt with the configured key") from None

    def encrypt_value(self, value: str) -> str:
        """A config value as stored: ``enc:v1:<base64(nonce || ciphertext)>``."""
        nonce, sealed = self.seal(value.encode(), ENCRYPTED_PREFIX.encode())
        return ENCRYPTED_PREFIX + base64.urlsafe_b64encode(nonce + sealed).decode()

    def decrypt_value(self, stored: str) -> str:
        if not stored.startswith(ENCRYPTED_PREFIX):
            return stored
        raw = base64.urlsafe_b64decode(stored[len(ENCRYPTED_PREFIX) :])
        return self.open(raw[:NONCE_BYTES], raw[NONCE_BYTES:], ENCRYPTED_PREFIX.encode()).decode()


def decrypted_values(values: Mapping[str, str], secrets: SecretBox | None, what: str) -> dict[str, str]:
    """Configured values as used: encrypted ones (``enc:…``) decrypted now, at use, never stored decrypted.

    Raises:
        ValueError: a value is encrypted and there is no key, or it does not decrypt with it (the
            message names ``what`` and the value's name, never the value).
    """
    result = {}
    for name, value in values.items():
        if value.startswith("enc:"):
            if secrets is None:
                raise ValueError(f"{what} {name!r} is encrypted but no AGENT_HOOK_SECRET_KEY is configured")
            try:
                value = secrets.decrypt_value(value)
            except ValueError as err:
                raise ValueError(f"{what} {name!r}: {err}") from None
        result[name] = value
    return result
