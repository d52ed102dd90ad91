"""Who the codec server lets in: the shared token (exactly), or a JWT signed by a key of the JWKS with the
right audience and issuer, not expired and already valid — and nothing that only looks like one."""

from __future__ import annotations

import json
import time

import pytest

from client.codec_auth import AuthError, BearerAuth, JwtVerifier, load_jwks

from ..jwt_tokens import AUDIENCE, ISSUER, IdentityProvider, b64url

TOKEN = "t" * 40


@pytest.fixture(scope="module")
def idp() -> IdentityProvider:
    return IdentityProvider()


@pytest.fixture
def auth(idp, tmp_path) -> BearerAuth:
    keys = load_jwks(idp.write_jwks(tmp_path / "jwks.json"))
    return BearerAuth(jwt=JwtVerifier(keys, AUDIENCE, ISSUER))


def test_the_shared_token_passes_exactly():
    auth = BearerAuth(token=TOKEN)
    auth.check(f"Bearer {TOKEN}")
    auth.check(f"bearer   {TOKEN}  ")
    for header in (None, "", TOKEN, f"Basic {TOKEN}", f"Bearer {TOKEN[:-1]}", f"Bearer {TOKEN}x", "Bearer "):
        with pytest.raises(AuthError):
            auth.check(header)


def test_a_server_with_neither_a_token_nor_a_jwks_serves_no_one():
    with pytest.raises(ValueError, match="AGENT_CODEC_TOKEN or AGENT_CODEC_JWKS_FILE"):
        BearerAuth()


@pytest.mark.parametrize("alg", ["RS256", "ES256", "EdDSA"])
def test_a_jwt_of_each_algorithm_passes(idp, auth, alg):
    auth.check(f"Bearer {idp.token(alg)}")
    auth.check(f"Bearer {idp.token(alg, kid=None)}")  # no kid: every key of its algorithm is tried
    auth.check(f"Bearer {idp.token(alg, aud=['other', AUDIENCE])}")


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        (lambda idp: idp.token(lifetime=-120), "expired"),
        (lambda idp: idp.token(exp=None), "no expiry"),
        (lambda idp: idp.token(exp="soon"), "not a number"),
        (lambda idp: idp.token(nbf=time.time() + 600), "not valid yet"),
        (lambda idp: idp.token(aud="another-app"), "audience"),
        (lambda idp: idp.token(aud=None), "audience"),
        (lambda idp: idp.token(iss="https://evil.test"), "issuer"),
        (lambda idp: idp.token(kid="rsa-2"), "no key"),
        (lambda idp: idp.token("ES256", kid="rsa-1"), "no key"),  # a key of another type under its kid
        (lambda idp: idp.token("HS256"), "not accepted"),
        (lambda idp: idp.token("none"), "not accepted"),
        (lambda idp: idp.token(header={"crit": ["exp"]}), "critical"),
        (lambda idp: idp.token()[:-4] + "AAAA", "signature"),
        (lambda idp: _resigned_claims(idp), "signature"),
        (lambda idp: IdentityProvider().token(), "signature"),  # another provider's key under the same kid
        (lambda idp: "a.b", "neither"),
        (lambda idp: "!!.!!.!!", "malformed"),
    ],
    ids=[
        "expired",
        "no-exp",
        "exp-not-a-number",
        "nbf-in-the-future",
        "other-audience",
        "no-audience",
        "other-issuer",
        "unknown-kid",
        "kid-of-another-type",
        "hmac",
        "alg-none",
        "crit",
        "bad-signature",
        "claims-changed",
        "another-providers-key",
        "two-parts",
        "malformed",
    ],
)
def test_a_bad_jwt_is_refused_with_its_reason(idp, auth, make, reason):
    with pytest.raises(AuthError, match=reason):
        auth.check(f"Bearer {make(idp)}")


def _resigned_claims(idp: IdentityProvider) -> str:
    """A valid token whose claims were swapped for others after signing."""
    head, _, signature = idp.token().split(".")
    forged = b64url(json.dumps({"iss": ISSUER, "aud": AUDIENCE, "exp": time.time() + 3600, "sub": "admin"}).encode())
    return f"{head}.{forged}.{signature}"


def test_either_the_token_or_a_jwt_passes_when_both_are_configured(idp, tmp_path):
    keys = load_jwks(idp.write_jwks(tmp_path / "jwks.json"))
    auth = BearerAuth(token=TOKEN, jwt=JwtVerifier(keys, AUDIENCE, ISSUER))
    auth.check(f"Bearer {TOKEN}")
    auth.check(f"Bearer {idp.token('EdDSA')}")
    with pytest.raises(AuthError):
        auth.check("Bearer " + "u" * 40)


def test_a_clock_a_little_behind_is_allowed(idp, auth):
    token = idp.token(lifetime=-30)  # expired half a minute ago: within the allowed skew
    auth.check(f"Bearer {token}")
    with pytest.raises(AuthError, match="expired"):
        auth.check(f"Bearer {token}", now=time.time() + 120)


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ("not json", "not JSON"),
        ('{"no": "keys"}', "not a JWKS"),
        ('{"keys": [{"kty": "oct", "k": "c2VjcmV0"}]}', "no RS256, ES256 or EdDSA"),
        ('{"keys": [{"kty": "RSA", "kid": "x", "n": "AQAB"}]}', "key 1"),
        ('{"keys": [{"kty": "RSA", "kid": "small", "n": "' + b64url(b"\xff" * 128) + '", "e": "AQAB"}]}', "2048"),
    ],
)
def test_a_jwks_that_cannot_be_used_is_refused_by_name(tmp_path, document, message):
    path = tmp_path / "jwks.json"
    path.write_text(document)
    with pytest.raises(ValueError, match=message):
        load_jwks(path)
