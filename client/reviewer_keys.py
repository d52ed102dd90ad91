"""Reviewers' keys: a reviewer's own signing key, the worker's trusted public keys, and signed decisions.

A reviewer holds a private key (``AGENT_REVIEWER_KEY``: PEM, Ed25519, EC P-256 or RSA, readable by its
owner only) and signs each decision with it; the worker trusts the public keys of its trust file
(``AGENT_REVIEWER_KEYS``), which it records in the pipeline's manifest so the workflow checks every
decision before accepting it (``workflows.review_proof``). The trust file::

    {
      "reviewers": {"alice": [{"kty": "OKP", "crv": "Ed25519", "x": "..."}]},
      "issuers": [{"issuer": "https://review.example.com", "keys": [{"kid": "k1", "kty": "EC", ...}]}]
    }

A reviewer's key speaks for that reviewer only (its id is its JWK thumbprint); an issuer's keys (a JWKS)
speak for whichever reviewer its tokens name. ``agent-lifecycle reviewer-key --reviewer alice`` makes a
key and adds its public half to a trust file.
"""

from __future__ import annotations

import json
import os
import stat
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature
from pydantic import ValidationError

from workflows import review_proof
from workflows.models import Checkpoint, ReviewerKey

# How long a signed decision is valid: enough to reach a busy worker, short enough to be worth nothing later.
DECISION_TTL_SECONDS = 600


class ReviewerKeyError(ValueError):
    """A key or trust file that cannot be used (the message names the file and the fix)."""


def _b64_int(value: int, length: int | None = None) -> str:
    length = length or (value.bit_length() + 7) // 8
    return review_proof.b64url(value.to_bytes(length, "big"))


def public_jwk(key: Any) -> dict[str, str]:
    """The public JWK of a public or private key, with its thumbprint as ``kid``."""
    public = key.public_key() if hasattr(key, "public_key") else key
    if isinstance(public, ec.EllipticCurvePublicKey):
        if not isinstance(public.curve, ec.SECP256R1):
            raise ReviewerKeyError(f"EC keys must be on P-256, not {public.curve.name}")
        numbers = public.public_numbers()
        jwk = {"kty": "EC", "crv": "P-256", "x": _b64_int(numbers.x, 32), "y": _b64_int(numbers.y, 32)}
    elif isinstance(public, rsa.RSAPublicKey):
        numbers = public.public_numbers()
        jwk = {"kty": "RSA", "n": _b64_int(numbers.n), "e": _b64_int(numbers.e)}
    else:
        raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        jwk = {"kty": "OKP", "crv": "Ed25519", "x": review_proof.b64url(raw)}
    return {**jwk, "kid": review_proof.jwk_thumbprint(jwk)}


@dataclass(frozen=True)
class SigningKey:
    """A reviewer's private key, ready to sign decisions."""

    kid: str
    alg: str
    private: Any

    def sign(self, data: bytes) -> bytes:
        if isinstance(self.private, ec.EllipticCurvePrivateKey):
            r, s = decode_dss_signature(self.private.sign(data, ec.ECDSA(hashes.SHA256())))
            return r.to_bytes(32, "big") + s.to_bytes(32, "big")
        if isinstance(self.private, rsa.RSAPrivateKey):
            return self.private.sign(data, padding.PKCS1v15(), hashes.SHA256())
        return self.private.sign(data)


def _owner_problem(path: Path, info: os.stat_result) -> str | None:
    if info.st_uid not in (0, os.geteuid()):
        return f"{path} is owned by uid {info.st_uid}, not by this user or root (chown it)"
    return None


def load_signing_key(path: Path) -> SigningKey:
    """The private key at ``path``: a PEM file that only its owner may read (as ssh insists).

    Raises:
        ReviewerKeyError: missing, readable by others, or not an Ed25519, P-256 or RSA private key.
    """
    try:
        info = path.stat()
        data = path.read_bytes()
    except OSError as err:
        raise ReviewerKeyError(f"reviewer key {path}: {err.strerror}") from None
    if info.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ReviewerKeyError(f"reviewer key {path} is readable by others (chmod 600 {path})")
    problem = _owner_problem(path, info)
    if problem:
        raise ReviewerKeyError(f"reviewer key {problem}")
    try:
        private = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as err:
        raise ReviewerKeyError(f"reviewer key {path} is not an unencrypted PEM private key: {err}") from None
    if isinstance(private, Ed25519PrivateKey):
        alg = "EdDSA"
    elif isinstance(private, ec.EllipticCurvePrivateKey) and isinstance(private.curve, ec.SECP256R1):
        alg = "ES256"
    elif isinstance(private, rsa.RSAPrivateKey) and private.key_size >= review_proof.MIN_RSA_BITS:
        alg = "RS256"
    else:
        raise ReviewerKeyError(f"reviewer key {path}: use an Ed25519, EC P-256 or RSA (2048+ bits) key")
    return SigningKey(kid=public_jwk(private)["kid"], alg=alg, private=private)


def generate_key(path: Path) -> dict[str, str]:
    """Make an Ed25519 key at ``path`` (created 0600; an existing file is refused) and return its public JWK."""
    private = Ed25519PrivateKey.generate()
    pem = private.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise ReviewerKeyError(f"{path} exists: keep it, or remove it first") from None
    with os.fdopen(fd, "wb") as out:
        out.write(pem)
    return public_jwk(private)


def sign_decision(
    key: SigningKey,
    checkpoint: Checkpoint,
    *,
    workflow_id: str,
    decision: str,
    reviewer: str,
    comment: str = "",
    declined: Sequence[str] = (),
    now: float | None = None,
    ttl_seconds: int = DECISION_TTL_SECONDS,
) -> str:
    """A compact JWS over the decision, bound to ``checkpoint``'s calls as the reviewer was shown them."""
    issued = int(time.time() if now is None else now)
    claims = {
        "iss": review_proof.REVIEWER_ISSUER,
        "sub": reviewer,
        "aud": review_proof.AUDIENCE,
        "iat": issued,
        "exp": issued + ttl_seconds,
        **review_proof.decision_claims(
            workflow_id=workflow_id,
            checkpoint_id=checkpoint.checkpoint_id,
            calls=review_proof.calls_digest(checkpoint.calls, checkpoint.plan),
            decision=decision,
            declined=declined,
            comment=comment,
        ),
    }
    header = {"alg": key.alg, "kid": key.kid, "typ": "JWT"}
    data = review_proof.signing_input(header, claims)
    return f"{data.decode('ascii')}.{review_proof.b64url(key.sign(data))}"


def _key(jwk: Any, where: str, *, principal: str | None = None, issuer: str | None = None) -> ReviewerKey:
    if not isinstance(jwk, dict):
        raise ReviewerKeyError(f"{where}: a key must be a JWK object")
    members = {name: jwk[name] for name in ("kty", "crv", "x", "y", "n", "e") if name in jwk}
    try:
        thumbprint = review_proof.jwk_thumbprint(members)
        # A reviewer's key is named by its thumbprint (what the signing side computes); an issuer names its own.
        kid = str(jwk.get("kid") or thumbprint) if issuer is not None else thumbprint
        key = ReviewerKey(kid=kid, principal=principal, issuer=issuer, **members)
        review_proof.public_key(key)
    except (ValueError, ValidationError) as err:
        raise ReviewerKeyError(f"{where}: {err}") from None
    return key


def load_trust_file(path: Path) -> list[ReviewerKey]:
    """The public keys the worker trusts for signed decisions.

    Raises:
        ReviewerKeyError: the file is missing, writable by others or not owned by this user or root (who
            can write it can approve anything), or holds something other than valid public keys.
    """
    try:
        info = path.stat()
        document = json.loads(path.read_text(encoding="utf-8"))
    except OSError as err:
        raise ReviewerKeyError(f"reviewer keys {path}: {err.strerror}") from None
    except ValueError as err:
        raise ReviewerKeyError(f"reviewer keys {path} is not JSON: {err}") from None
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise ReviewerKeyError(f"reviewer keys {path} is writable by others (chmod go-w {path})")
    problem = _owner_problem(path, info)
    if problem:
        raise ReviewerKeyError(f"reviewer keys {problem}")
    if not isinstance(document, dict) or set(document) - {"reviewers", "issuers"}:
        raise ReviewerKeyError(f"reviewer keys {path}: expected an object with 'reviewers' and/or 'issuers'")
    keys: list[ReviewerKey] = []
    reviewers = document.get("reviewers", {})
    if not isinstance(reviewers, dict):
        raise ReviewerKeyError(f"reviewer keys {path}: 'reviewers' maps each reviewer to a list of JWKs")
    for reviewer, jwks in reviewers.items():
        if not reviewer.strip() or not isinstance(jwks, list) or not jwks:
            raise ReviewerKeyError(f"reviewer keys {path}: reviewer {reviewer!r} needs a non-empty list of JWKs")
        keys += [_key(jwk, f"{path} reviewer {reviewer!r}", principal=reviewer) for jwk in jwks]
    issuers = document.get("issuers", [])
    if not isinstance(issuers, list):
        raise ReviewerKeyError(f"reviewer keys {path}: 'issuers' is a list of {{issuer, keys}}")
    for entry in issuers:
        if not isinstance(entry, dict) or not isinstance(entry.get("issuer"), str) or not entry["issuer"].strip():
            raise ReviewerKeyError(f"reviewer keys {path}: each issuer needs an 'issuer' name and 'keys'")
        jwks = entry.get("keys")
        if not isinstance(jwks, list) or not jwks:
            raise ReviewerKeyError(f"reviewer keys {path}: issuer {entry['issuer']!r} needs a non-empty 'keys' list")
        keys += [_key(jwk, f"{path} issuer {entry['issuer']!r}", issuer=entry["issuer"]) for jwk in jwks]
    kids = [key.kid for key in keys]
    duplicate = next((kid for kid in kids if kids.count(kid) > 1), None)
    if duplicate is not None:
        raise ReviewerKeyError(f"reviewer keys {path}: key id {duplicate!r} appears twice")
    if not keys:
        raise ReviewerKeyError(f"reviewer keys {path} holds no keys")
    return keys


def trust_reviewer_key(path: Path, reviewer: str, jwk: dict[str, str]) -> None:
    """Add ``reviewer``'s public key to the trust file at ``path`` (created if missing, mode 0644)."""
    document: dict[str, Any] = {"reviewers": {}}
    if path.exists():
        document = json.loads(path.read_text(encoding="utf-8"))
    listed = document.setdefault("reviewers", {}).setdefault(reviewer, [])
    public = {name: value for name, value in jwk.items() if name != "kid"}
    if public not in listed:
        listed.append(public)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    temporary.chmod(0o644)
    temporary.replace(path)
