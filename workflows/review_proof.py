"""What a reviewer's decision proves, and how it is checked.

A pipeline chooses how it knows who decided a checkpoint (``ReviewSettings.verification``):

- ``signed``: the decision carries ``proof``, a compact JWS over the decision's claims — the request's
  workflow id, the checkpoint, a digest of the exact calls the checkpoint shows, the decision, the calls
  it declines and a digest of its comment — signed by a reviewer's own key (which speaks for that
  reviewer only) or by a configured issuer's key (which speaks for the reviewer its ``sub`` names). The
  public keys are in the pipeline's manifest, so the check runs in workflow code, before an update is
  accepted, and replays as it ran; no secret ever enters the history. A decision signed for other calls,
  another checkpoint or another request, or altered in transit, is refused.
- ``server_identity``: the reviewer is the identity the Temporal server received the update or signal
  with (``workflows.callers``). Sound only where the server's authorizer refuses a caller that presents
  an identity other than its own.
- ``none``: a typed name, checked against the reviewer list. Anyone who can reach the namespace can type
  any name: for development only.

Pure functions, shared by the workflow (verification) and clients (the claims they sign).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature

from .models import ApprovalCall, Plan, ReviewerKey

# The audience every decision token names, and the issuer of tokens a reviewer signs with their own key.
AUDIENCE = "agent-lifecycle/review"
REVIEWER_ISSUER = "agent-lifecycle/reviewer"
# How far a token's issue time may lie in the workflow's future (clocks drift), and the longest life a
# token may claim: a decision is bound to one checkpoint anyway; a short life limits what a leaked one is worth.
CLOCK_SKEW_SECONDS = 300
MAX_TOKEN_LIFETIME_SECONDS = 24 * 3600
# The JWS algorithm each kind of key signs with.
ALGORITHMS = {"OKP": "EdDSA", "EC": "ES256", "RSA": "RS256"}
MIN_RSA_BITS = 2048


def canonical_json(value: Any) -> bytes:
    """One byte string per JSON value: sorted keys, no spaces, UTF-8."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def calls_digest(calls: Sequence[ApprovalCall], plan: Plan) -> str:
    """The digest of what approving a checkpoint runs: each call's step, tool and exact arguments (the
    plan's steps as planned, for a checkpoint that lists no calls)."""
    keys = {step.step_id: step.tool_key for step in plan.steps}
    if calls:
        listed = [{"step_id": c.step_id, "tool": keys.get(c.step_id, c.tool), "arguments": c.arguments} for c in calls]
    else:
        listed = [{"step_id": s.step_id, "tool": s.tool_key, "arguments": s.arguments} for s in plan.steps]
    return digest(canonical_json(listed))


def comment_digest(comment: str) -> str:
    return digest(comment.encode("utf-8", "surrogatepass"))


def decision_claims(
    *,
    workflow_id: str,
    checkpoint_id: str,
    calls: str,
    decision: str,
    declined: Sequence[str],
    comment: str,
) -> dict[str, Any]:
    """The claims that bind a decision to what it decides (a token adds ``iss``, ``sub``, ``aud``,
    ``iat``, ``exp``)."""
    return {
        "wid": workflow_id,
        "cid": checkpoint_id,
        "calls": calls,
        "decision": decision,
        "declined": sorted(set(declined)),
        "comment": comment_digest(comment),
    }


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def unb64url(text: str) -> bytes:
    if not isinstance(text, str) or any(c not in _B64URL for c in text):
        raise ValueError("not base64url")
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


_B64URL = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")


def signing_input(header: dict[str, Any], claims: dict[str, Any]) -> bytes:
    return f"{b64url(canonical_json(header))}.{b64url(canonical_json(claims))}".encode("ascii")


def jwk_thumbprint(jwk: dict[str, Any]) -> str:
    """A key's id: its JWK thumbprint (the SHA-256 of its required public members, base64url)."""
    required = {"OKP": ("crv", "kty", "x"), "EC": ("crv", "kty", "x", "y"), "RSA": ("e", "kty", "n")}
    members = required.get(str(jwk.get("kty")))
    if members is None:
        raise ValueError(f"unsupported key type {jwk.get('kty')!r} (OKP Ed25519, EC P-256 or RSA)")
    return b64url(hashlib.sha256(canonical_json({m: jwk.get(m) for m in members})).digest())


def public_key(key: ReviewerKey) -> Ed25519PublicKey | ec.EllipticCurvePublicKey | rsa.RSAPublicKey:
    """The key a JWK's public members describe. Raises ValueError for anything else."""
    try:
        if key.kty == "OKP" and key.crv == "Ed25519" and key.x:
            return Ed25519PublicKey.from_public_bytes(unb64url(key.x))
        if key.kty == "EC" and key.crv == "P-256" and key.x and key.y:
            numbers = ec.EllipticCurvePublicNumbers(
                int.from_bytes(unb64url(key.x), "big"), int.from_bytes(unb64url(key.y), "big"), ec.SECP256R1()
            )
            return numbers.public_key()
        if key.kty == "RSA" and key.n and key.e:
            rsa_key = rsa.RSAPublicNumbers(
                int.from_bytes(unb64url(key.e), "big"), int.from_bytes(unb64url(key.n), "big")
            ).public_key()
            if rsa_key.key_size < MIN_RSA_BITS:
                raise ValueError(f"an RSA key of {rsa_key.key_size} bits (at least {MIN_RSA_BITS})")
            return rsa_key
    except (ValueError, binascii.Error) as err:
        raise ValueError(f"key {key.kid!r} is not a valid {key.kty} public key: {err}") from None
    raise ValueError(f"key {key.kid!r}: unsupported key (OKP Ed25519, EC P-256 or RSA)")


def _verify_signature(key: ReviewerKey, data: bytes, signature: bytes) -> bool:
    verifier = public_key(key)
    try:
        if isinstance(verifier, Ed25519PublicKey):
            verifier.verify(signature, data)
        elif isinstance(verifier, ec.EllipticCurvePublicKey):
            if len(signature) != 64:
                return False
            der = encode_dss_signature(int.from_bytes(signature[:32], "big"), int.from_bytes(signature[32:], "big"))
            verifier.verify(der, data, ec.ECDSA(hashes.SHA256()))
        else:
            verifier.verify(signature, data, padding.PKCS1v15(), hashes.SHA256())
    except InvalidSignature:
        return False
    return True


@dataclass(frozen=True)
class Verified:
    """Who a valid proof says decided, and by what key."""

    principal: str
    verified_by: str


def verify_decision(token: str, keys: Sequence[ReviewerKey], expected: dict[str, Any], now: datetime) -> Verified | str:
    """Check ``token`` proves the decision whose claims are ``expected`` (:func:`decision_claims`).

    Returns the verified reviewer, or why the proof proves nothing (one line, for the reviewer and the
    record). Never raises on what a caller sends."""
    parts = token.split(".") if isinstance(token, str) else []
    if len(parts) != 3:
        return "the proof is not a compact JWS (header.claims.signature)"
    try:
        header = json.loads(unb64url(parts[0]))
        claims = json.loads(unb64url(parts[1]))
        signature = unb64url(parts[2])
    except ValueError:
        return "the proof is not a compact JWS: a part is not base64url JSON"
    if not isinstance(header, dict) or not isinstance(claims, dict):
        return "the proof's header and claims must be JSON objects"
    kid, alg = header.get("kid"), header.get("alg")
    key = next((k for k in keys if k.kid == kid), None)
    if key is None:
        return f"the proof is signed with key {str(kid)[:80]!r}, which this pipeline does not trust"
    if alg != ALGORITHMS[key.kty]:
        return f"key {key.kid!r} signs with {ALGORITHMS[key.kty]}, not {str(alg)[:20]!r}"
    if not _verify_signature(key, f"{parts[0]}.{parts[1]}".encode("ascii"), signature):
        return f"the proof's signature does not verify with key {key.kid!r}"
    issuer = key.issuer or REVIEWER_ISSUER
    if claims.get("iss") != issuer:
        return f"the proof's issuer is {str(claims.get('iss'))[:80]!r}, not {issuer!r} (key {key.kid!r})"
    if claims.get("aud") != AUDIENCE:
        return f"the proof is not for {AUDIENCE!r}"
    principal = claims.get("sub")
    if not isinstance(principal, str) or not principal.strip():
        return "the proof names no reviewer (sub)"
    if key.principal is not None and principal != key.principal:
        return f"key {key.kid!r} speaks for {key.principal!r}, not {principal[:80]!r}"
    iat, exp = claims.get("iat"), claims.get("exp")
    if type(iat) is not int or type(exp) is not int:
        return "the proof must give iat and exp as integer seconds"
    at = int(now.timestamp())
    if exp <= at:
        return "the proof has expired"
    if iat > at + CLOCK_SKEW_SECONDS:
        return "the proof is issued in the future"
    if exp - iat > MAX_TOKEN_LIFETIME_SECONDS:
        return f"the proof claims a life over {MAX_TOKEN_LIFETIME_SECONDS} s"
    for name, value in expected.items():
        if claims.get(name) != value:
            return _mismatch(name)
    via = f"issuer {issuer} key {key.kid}" if key.issuer else f"key {key.kid} of {key.principal}"
    return Verified(principal=principal, verified_by=via)


def _mismatch(claim: str) -> str:
    what = {
        "wid": "another request",
        "cid": "another checkpoint",
        "calls": "other calls than the checkpoint's (its arguments changed, or the reviewer saw others)",
        "decision": "another decision",
        "declined": "other declined calls",
        "comment": "another comment",
    }.get(claim, f"another {claim}")
    return f"the proof was signed for {what}"
