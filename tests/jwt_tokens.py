"""JSON Web Tokens for the tests, signed with keys made here by ``cryptography``: an identity provider's
JWKS file and the tokens it would issue (RS256, ES256, EdDSA), good and bad."""

from __future__ import annotations

import base64
import json
import time
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, padding, rsa
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature

AUDIENCE = "temporal-ui"
ISSUER = "https://idp.test"


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _uint(value: int) -> str:
    return b64url(value.to_bytes((value.bit_length() + 7) // 8, "big"))


class IdentityProvider:
    """Three signing keys (one per algorithm) and their JWKS."""

    def __init__(self) -> None:
        self.rsa = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.ec = ec.generate_private_key(ec.SECP256R1())
        self.ed = ed25519.Ed25519PrivateKey.generate()

    def jwks(self) -> dict[str, Any]:
        rsa_numbers = self.rsa.public_key().public_numbers()
        ec_numbers = self.ec.public_key().public_numbers()
        from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

        ed_raw = self.ed.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
        return {
            "keys": [
                {
                    "kty": "RSA",
                    "kid": "rsa-1",
                    "alg": "RS256",
                    "use": "sig",
                    "n": _uint(rsa_numbers.n),
                    "e": _uint(rsa_numbers.e),
                },
                {
                    "kty": "EC",
                    "kid": "ec-1",
                    "crv": "P-256",
                    "x": b64url(ec_numbers.x.to_bytes(32, "big")),
                    "y": b64url(ec_numbers.y.to_bytes(32, "big")),
                },
                {"kty": "OKP", "kid": "ed-1", "crv": "Ed25519", "x": b64url(ed_raw)},
            ]
        }

    def write_jwks(self, path: Path) -> Path:
        path.write_text(json.dumps(self.jwks()))
        return path

    def token(
        self,
        alg: str = "RS256",
        *,
        kid: str | None = "default",
        lifetime: float = 300,
        header: dict[str, Any] | None = None,
        **claims: Any,
    ) -> str:
        """A token signed with this provider's key for ``alg``; ``claims`` override the defaults (a value
        of None drops the claim)."""
        now = time.time()
        body = {"iss": ISSUER, "aud": AUDIENCE, "sub": "operator", "iat": int(now), "exp": int(now + lifetime)}
        body.update(claims)
        body = {k: v for k, v in body.items() if v is not None}
        default_kid = {"RS256": "rsa-1", "ES256": "ec-1", "EdDSA": "ed-1"}.get(alg)
        head = {"alg": alg, "typ": "JWT", **({"kid": default_kid if kid == "default" else kid} if kid else {})}
        head.update(header or {})
        signing_input = f"{b64url(json.dumps(head).encode())}.{b64url(json.dumps(body).encode())}".encode()
        return signing_input.decode() + "." + b64url(self.sign(alg, signing_input))

    def sign(self, alg: str, data: bytes) -> bytes:
        if alg == "RS256":
            return self.rsa.sign(data, padding.PKCS1v15(), hashes.SHA256())
        if alg == "ES256":
            r, s = decode_dss_signature(self.ec.sign(data, ec.ECDSA(hashes.SHA256())))
            return r.to_bytes(32, "big") + s.to_bytes(32, "big")
        if alg == "EdDSA":
            return self.ed.sign(data)
        return b""
