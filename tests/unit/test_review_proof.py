"""Signed decisions on their own: every key kind round-trips, a token proves only what it was signed for,
and the key files a reviewer and a worker use are refused when they cannot be trusted."""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from client.pipeline import PipelineSettingsError, review_settings
from client.reviewer_keys import (
    ReviewerKeyError,
    generate_key,
    load_signing_key,
    load_trust_file,
    public_jwk,
    sign_decision,
    trust_reviewer_key,
)
from client.settings import Settings
from workflows import review_proof
from workflows.models import ApprovalCall, Checkpoint, Plan, PlanStep, ReviewerKey

NOW = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)


def checkpoint(to: str = "carol") -> Checkpoint:
    step = PlanStep(step_id="notify", namespace="t", agent="mail", capability="send", arguments={"to": to})
    return Checkpoint(
        checkpoint_id="cp-1-abc",
        phase=1,
        plan=Plan(phase=1, steps=[step]),
        reasons=[],
        calls=[ApprovalCall(step_id="notify", tool="mail/send", arguments={"to": to})],
        requested_at=NOW,
        expires_at=NOW,
    )


def expected(cp: Checkpoint, decision: str = "approve") -> dict:
    return review_proof.decision_claims(
        workflow_id="wf",
        checkpoint_id=cp.checkpoint_id,
        calls=review_proof.calls_digest(cp.calls, cp.plan),
        decision=decision,
        declined=(),
        comment="",
    )


def pem_file(path: Path, private) -> Path:
    path.write_bytes(
        private.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    path.chmod(0o600)
    return path


@pytest.mark.parametrize(
    "make",
    [
        lambda: ec.generate_private_key(ec.SECP256R1()),
        lambda: rsa.generate_private_key(public_exponent=65537, key_size=2048),
        None,  # Ed25519, made by generate_key
    ],
    ids=["ES256", "RS256", "EdDSA"],
)
def test_every_kind_of_reviewer_key_signs_a_decision_the_workflow_verifies(tmp_path, make):
    path = tmp_path / "reviewer.key"
    if make is None:
        jwk = generate_key(path)
    else:
        pem_file(path, make())
        jwk = public_jwk(serialization.load_pem_private_key(path.read_bytes(), password=None))
    key = load_signing_key(path)
    trusted = [ReviewerKey(principal="alice", **jwk)]
    cp = checkpoint()
    token = sign_decision(key, cp, workflow_id="wf", decision="approve", reviewer="alice", now=NOW.timestamp() - 10)
    verified = review_proof.verify_decision(token, trusted, expected(cp), NOW)
    assert verified == review_proof.Verified("alice", f"key {key.kid} of alice")
    # The same token proves nothing about other arguments or another decision.
    assert review_proof.verify_decision(token, trusted, expected(checkpoint("mallory")), NOW) == (
        "the proof was signed for other calls than the checkpoint's (its arguments changed, or the reviewer saw others)"
    )
    assert review_proof.verify_decision(token, trusted, expected(cp, "reject"), NOW) == (
        "the proof was signed for another decision"
    )


def test_the_calls_digest_covers_the_tool_its_namespace_and_every_argument():
    base = checkpoint()
    digest = review_proof.calls_digest(base.calls, base.plan)
    assert digest.startswith("sha256:") and digest == review_proof.calls_digest(base.calls, base.plan)
    other_namespace = base.plan.model_copy(deep=True)
    other_namespace.steps[0].namespace = "evil"
    assert review_proof.calls_digest(base.calls, other_namespace) != digest
    assert review_proof.calls_digest(checkpoint("carol ").calls, base.plan) != digest
    # A checkpoint without listed calls is bound to its plan's steps: the same call, the same digest.
    assert review_proof.calls_digest([], base.plan) == digest
    assert review_proof.calls_digest([], checkpoint("dave").plan) != digest


def test_a_token_that_is_not_one_proves_nothing_and_raises_nothing():
    cp, keys = checkpoint(), [ReviewerKey(kid="k", kty="OKP", crv="Ed25519", x="A" * 43, principal="a")]
    for token in ("", "a.b", "a.b.c.d", "!!.!!.!!", "e30.e30.", "W10.W10.AA", 42):
        assert isinstance(review_proof.verify_decision(token, keys, expected(cp), NOW), str)  # type: ignore[arg-type]


def test_a_reviewer_key_readable_by_others_or_not_a_private_key_is_refused(tmp_path):
    path = tmp_path / "alice.key"
    generate_key(path)
    path.chmod(0o644)
    with pytest.raises(ReviewerKeyError, match=f"readable by others \\(chmod 600 {path}\\)"):
        load_signing_key(path)
    path.chmod(0o600)
    load_signing_key(path)
    with pytest.raises(ReviewerKeyError, match="exists"):
        generate_key(path)  # never overwritten
    weak = pem_file(tmp_path / "weak.key", ec.generate_private_key(ec.SECP384R1()))
    with pytest.raises(ReviewerKeyError, match="Ed25519, EC P-256 or RSA"):
        load_signing_key(weak)
    (tmp_path / "junk.key").write_text("not a key")
    (tmp_path / "junk.key").chmod(0o600)
    with pytest.raises(ReviewerKeyError, match="not an unencrypted PEM private key"):
        load_signing_key(tmp_path / "junk.key")


def test_a_trust_file_others_can_write_or_that_holds_no_valid_key_is_refused(tmp_path):
    trust = tmp_path / "reviewers.json"
    alice = generate_key(tmp_path / "alice.key")
    trust_reviewer_key(trust, "alice", alice)
    [key] = load_trust_file(trust)
    assert (key.principal, key.kid) == ("alice", alice["kid"])
    trust.chmod(0o666)
    with pytest.raises(ReviewerKeyError, match="writable by others"):
        load_trust_file(trust)
    trust.chmod(0o644)
    os.chown(trust, 65534, 65534)  # nobody
    with pytest.raises(ReviewerKeyError, match="owned by uid 65534"):
        load_trust_file(trust)
    os.chown(trust, os.geteuid(), os.getegid())
    bad = {
        "not json": "{",
        "no keys": json.dumps({"reviewers": {}}),
        "unknown section": json.dumps({"admins": {}}),
        "a private member only": json.dumps({"reviewers": {"bob": [{"kty": "OKP", "crv": "Ed25519"}]}}),
        "a short RSA key": json.dumps({"reviewers": {"bob": [public_jwk(rsa.generate_private_key(65537, 1024))]}}),
        "twice the same key": json.dumps({"reviewers": {"a": [alice], "b": [alice]}}),
        "an issuer without keys": json.dumps({"issuers": [{"issuer": "https://x"}]}),
    }
    for case, text in bad.items():
        trust.write_text(text)
        with pytest.raises(ReviewerKeyError):
            load_trust_file(trust)
            pytest.fail(case)


def test_reviewers_named_with_nothing_to_verify_them_stop_the_worker(tmp_path):
    with pytest.raises(PipelineSettingsError, match="AGENT_REVIEWERS: names reviewers, but nothing verifies"):
        review_settings(Settings(reviewers=["alice"], state_dir=tmp_path))
    with pytest.raises(PipelineSettingsError, match="AGENT_REVIEW_VERIFICATION: signed decisions need"):
        review_settings(Settings(review_verification="signed", state_dir=tmp_path))
    trust = tmp_path / "reviewers.json"
    trust_reviewer_key(trust, "alice", generate_key(tmp_path / "alice.key"))
    with pytest.raises(PipelineSettingsError, match="AGENT_REVIEWER_KEYS: reviewer keys are given but"):
        review_settings(Settings(reviewer_keys=trust, review_verification="none", state_dir=tmp_path))
    signed = review_settings(Settings(reviewers=["alice"], reviewer_keys=trust, state_dir=tmp_path))
    assert (signed.verification, [k.principal for k in signed.keys]) == ("signed", ["alice"])
    typed = review_settings(Settings(reviewers=["alice"], review_verification="none", state_dir=tmp_path))
    assert (typed.verification, typed.keys) == ("none", [])
    assert review_settings(Settings(state_dir=tmp_path)).verification == "none"
    identity = review_settings(Settings(review_verification="server-identity", state_dir=tmp_path))
    assert identity.verification == "server_identity"
