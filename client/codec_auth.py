"""Who may call the codec server: a bearer token, either a shared secret (compared in constant time) or a
JSON Web Token signed by a key of a JWKS file (the Web UI's users' access tokens, which the UI passes on
with ``TEMPORAL_CODEC_PASS_ACCESS_TOKEN``).

A JWT passes only when it is signed with RS256, ES256 or EdDSA (Ed25519) by a key of the JWKS whose type
fits the algorithm (the ``kid`` names it, when the token has one), has not expired (``exp`` is required),
is already valid (``nbf``), and carries the configured audience (``aud``) and issuer (``iss``); a minute
of clock skew is allowed. ``alg: none``, HMAC algorithms, unknown ``crit`` headers and malformed tokens
are refused. Implemented on ``cryptography`` alone.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, padding, rsa
from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature

LEEWAY_SECONDS = 60.0
_KTY_OF = {"RS256": "RSA", "ES256": "EC", "EdDSA": "OKP"}
PublicKey = rsa.RSAPublicKey | ec.EllipticCurvePublicKey | ed25519.Ed25519PublicKey


class AuthError(Exception):
    """A request the codec server refuses with 401; the message says why (never the token)."""


@dataclass(frozen=True)
class Jwk:
    kid: str | None
    alg: str  # the algorithm this key verifies
    key: PublicKey = field(repr=False)


def _b64url(text: str) -> bytes:
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError):
        raise ValueError("not base64url") from None


def _uint(text: str) -> int:
    return int.from_bytes(_b64url(text), "big")


def _jwk(entry: Mapping[str, Any]) -> Jwk | None:
    """One JWKS entry as a verification key, or None for one this server does not use (encryption keys, other
    curves, symmetric keys)."""
    if entry.get("use", "sig") != "sig":
        return None
    kty, kid, alg = entry.get("kty"), entry.get("kid"), entry.get("alg")
    kid = str(kid) if kid is not None else None
    if kty == "RSA" and alg in (None, "RS256"):
        key: PublicKey = rsa.RSAPublicNumbers(_uint(entry["e"]), _uint(entry["n"])).public_key()
        if key.key_size < 2048:
            raise ValueError(f"RSA key {kid!r} has {key.key_size} bits; at least 2048")
        return Jwk(kid, "RS256", key)
    if kty == "EC" and entry.get("crv") == "P-256" and alg in (None, "ES256"):
        numbers = ec.EllipticCurvePublicNumbers(_uint(entry["x"]), _uint(entry["y"]), ec.SECP256R1())
        return Jwk(kid, "ES256", numbers.public_key())
    if kty == "OKP" and entry.get("crv") == "Ed25519" and alg in (None, "EdDSA", "Ed25519"):
        return Jwk(kid, "EdDSA", ed25519.Ed25519PublicKey.from_public_bytes(_b64url(entry["x"])))
    return None


def load_jwks(path: Path) -> list[Jwk]:
    """The signature keys of a JWKS file (``{"keys": [...]}``). Raises ``ValueError`` naming what is wrong:
    not JSON, a key that does not parse, no usable key at all."""
    try:
        document = json.loads(path.read_text())
    except OSError as err:
        raise ValueError(f"cannot read {path}: {err.strerror or err}") from None
    except ValueError:
        raise ValueError(f"{path} is not JSON") from None
    entries = document.get("keys") if isinstance(document, dict) else None
    if not isinstance(entries, list):
        raise ValueError(f'{path} is not a JWKS: no "keys" list')
    keys = []
    for number, entry in enumerate(entries, start=1):
        if not isinstance(entry, dict):
            raise ValueError(f"{path}, key {number}: not an object")
        try:
            key = _jwk(entry)
        except (KeyError, ValueError, TypeError) as err:
            raise ValueError(f"{path}, key {number} ({entry.get('kid', 'no kid')}): {err}") from None
        if key is not None:
            keys.append(key)
    if not keys:
        raise ValueError(f"{path} has no RS256, ES256 or EdDSA signature key")
    return keys


def _verify(jwk: Jwk, signature: bytes, signed: bytes) -> bool:
    try:
        if isinstance(jwk.key, rsa.RSAPublicKey):
            jwk.key.verify(signature, signed, padding.PKCS1v15(), hashes.SHA256())
        elif isinstance(jwk.key, ec.EllipticCurvePublicKey):
            if len(signature) != 64:
                return False
            der = encode_dss_signature(int.from_bytes(signature[:32], "big"), int.from_bytes(signature[32:], "big"))
            jwk.key.verify(der, signed, ec.ECDSA(hashes.SHA256()))
        else:
            jwk.key.verify(signature, signed)
    except InvalidSignature:
        return False
    return True


def _number(claims: Mapping[str, Any], name: str) -> float | None:
    value = claims.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise AuthError(f"the token's {name!r} is not a number")
    return float(value)


@dataclass(frozen=True)
class JwtVerifier:
    keys: list[Jwk]
    audience: str
    issuer: str
    leeway_seconds: float = LEEWAY_SECONDS

    def verify(self, token: str, now: float | None = None) -> dict[str, Any]:
        """The claims of a valid token; :class:`AuthError` otherwise."""
        now = time.time() if now is None else now
        parts = token.split(".")
        if len(parts) != 3:
            raise AuthError("the bearer token is neither the shared token nor a JWT")
        try:
            header = json.loads(_b64url(parts[0]))
            claims = json.loads(_b64url(parts[1]))
            signature = _b64url(parts[2])
        except ValueError:
            raise AuthError("the JWT is malformed") from None
        if not isinstance(header, dict) or not isinstance(claims, dict):
            raise AuthError("the JWT is malformed")
        alg = header.get("alg")
        if alg not in _KTY_OF:
            raise AuthError(f"the JWT's algorithm {alg!r} is not accepted (RS256, ES256, EdDSA)")
        if header.get("crit"):
            raise AuthError("the JWT has critical headers this server does not know")
        kid = header.get("kid")
        candidates = [k for k in self.keys if k.alg == alg and (kid is None or k.kid == kid)]
        if not candidates:
            raise AuthError("no key of the JWKS verifies this JWT (its kid or algorithm)")
        signed = f"{parts[0]}.{parts[1]}".encode("ascii", "replace")
        if not any(_verify(k, signature, signed) for k in candidates):
            raise AuthError("the JWT's signature does not verify")
        expires, not_before = _number(claims, "exp"), _number(claims, "nbf")
        if expires is None:
            raise AuthError("the JWT has no expiry (exp)")
        if now >= expires + self.leeway_seconds:
            raise AuthError("the JWT has expired")
        if not_before is not None and now < not_before - self.leeway_seconds:
            raise AuthError("the JWT is not valid yet (nbf)")
        audience = claims.get("aud")
        audiences = audience if isinstance(audience, list) else [audience]
        if self.audience not in audiences:
            raise AuthError("the JWT is not for this audience (aud)")
        if claims.get("iss") != self.issuer:
            raise AuthError("the JWT is from another issuer (iss)")
        return claims


@dataclass(frozen=True)
class BearerAuth:
    """What the codec server accepts: the shared token, a JWT the verifier accepts, or either."""

    token: str | None = field(default=None, repr=False)
    jwt: JwtVerifier | None = None

    def __post_init__(self) -> None:
        if not self.token and self.jwt is None:
            raise ValueError("the codec server needs AGENT_CODEC_TOKEN or AGENT_CODEC_JWKS_FILE: it serves no one else")

    def check(self, authorization: str | None, now: float | None = None) -> None:
        """Raise :class:`AuthError` unless ``authorization`` (the header) carries an accepted token."""
        scheme, _, given = (authorization or "").strip().partition(" ")
        given = given.strip()
        if scheme.lower() != "bearer" or not given:
            raise AuthError("a bearer token is required (Authorization: Bearer …)")
        if self.token is not None and hmac.compare_digest(given.encode(), self.token.encode()):
            return
        if self.jwt is None:
            raise AuthError("the bearer token is not the codec server's token")
        self.jwt.verify(given, now)
