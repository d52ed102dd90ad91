"""Reviewers are verified principals: a decision proves who made it and what it decides, checked by the
workflow before the update is accepted — tried as an attacker would, against a real Temporal server.

Signed decisions (a reviewer's own key, or a trusted issuer's token), the identity the server received a
decision with, four-eyes (a requester may not approve their own request), and the approval bound to the
exact calls the checkpoint shows: a forged, tampered, replayed or re-targeted decision is refused, the
tool does not run, and the record keeps the verified principal and what proved it."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric import ec
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

from client.reviewer_keys import SigningKey, generate_key, load_signing_key, public_jwk, sign_decision
from workflows import review_proof
from workflows.models import (
    ApproveSignal,
    Checkpoint,
    RequestInput,
    ReviewAck,
    ReviewerKey,
    ReviewRequest,
    ReviewSettings,
)

from .doubles import FixedPlanner, eventually
from .harness import Harness
from .test_checkpoints import live_record, message, outbox, refused_update, tool_step_ids

ISSUER = "https://sso.test"


class Keys:
    """Alice's and bob's own keys, a trusted issuer's key, and mallory's key that nobody trusts."""

    def __init__(self, directory: Path) -> None:
        self.own: dict[str, SigningKey] = {}
        self.trusted: list[ReviewerKey] = []
        for name in ("alice", "bob", "mallory"):
            jwk = generate_key(directory / f"{name}.key")
            self.own[name] = load_signing_key(directory / f"{name}.key")
            if name != "mallory":
                self.trusted.append(ReviewerKey(principal=name, **jwk))
        issuer_private = ec.generate_private_key(ec.SECP256R1())
        self.issuer = SigningKey(kid="sso-2026", alg="ES256", private=issuer_private)
        jwk = {k: v for k, v in public_jwk(issuer_private).items() if k != "kid"}
        self.trusted.append(ReviewerKey(kid="sso-2026", issuer=ISSUER, **jwk))

    def review(self, **fields: Any) -> ReviewSettings:
        return ReviewSettings(verification="signed", keys=self.trusted, **fields)


def issued(key: SigningKey, claims: dict[str, Any], **header: Any) -> str:
    """A token as an issuer (or an attacker) writes one: any header and claims, signed with ``key``."""
    head = {"alg": key.alg, "kid": key.kid, "typ": "JWT", **header}
    data = review_proof.signing_input(head, claims)
    return f"{data.decode()}.{review_proof.b64url(key.sign(data))}"


def issuer_claims(workflow_id: str, checkpoint: Checkpoint, sub: str, *, decision: str = "approve", **over: Any):
    now = int(time.time())
    claims = {
        "iss": ISSUER,
        "sub": sub,
        "aud": review_proof.AUDIENCE,
        "iat": now,
        "exp": now + 300,
        **review_proof.decision_claims(
            workflow_id=workflow_id,
            checkpoint_id=checkpoint.checkpoint_id,
            calls=review_proof.calls_digest(checkpoint.calls, checkpoint.plan),
            decision=decision,
            declined=(),
            comment="",
        ),
    }
    return {**claims, **over}


def tampered(token: str, **claims: Any) -> str:
    """``token`` with some claims rewritten and its signature kept."""
    header, body, signature = token.split(".")
    changed = {**json.loads(review_proof.unb64url(body)), **claims}
    return f"{header}.{review_proof.b64url(review_proof.canonical_json(changed))}.{signature}"


async def start(h: Harness, leftovers: list, *, requested_by: str | None = None, metadata: dict | None = None):
    handle = await h.client.start_workflow(
        "RequestLifecycle",
        RequestInput(request="tell carol hello", requested_by=requested_by, metadata=metadata or {}),
        id=f"req-{uuid.uuid4()}",
        task_queue=h.task_queue,
    )
    leftovers.append(handle)
    return handle


def executed(history) -> list[str]:
    return [
        e.activity_task_scheduled_event_attributes.activity_type.name
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
        and e.activity_task_scheduled_event_attributes.activity_type.name == "execute_tool_step"
    ]


async def test_only_a_decision_signed_by_a_trusted_reviewer_for_the_calls_shown_runs_anything(
    client, tmp_path, leftovers
):
    keys = Keys(tmp_path)
    planner = FixedPlanner(message("notify", "carol", "hello"))
    async with Harness(client, tmp_path, planner=planner, review=keys.review()) as h:
        handle = await start(h, leftovers)
        checkpoint = await h.wait_for_checkpoint(handle)
        cp, wid = checkpoint.checkpoint_id, handle.id
        assert checkpoint.calls_digest == review_proof.calls_digest(checkpoint.calls, checkpoint.plan)

        def signed(name: str, shown: Checkpoint = checkpoint, **kwargs: Any) -> str:
            fields = {"workflow_id": wid, "decision": "approve", "reviewer": name, **kwargs}
            return sign_decision(keys.own[name], shown, **fields)

        other_args = checkpoint.model_copy(deep=True)
        other_args.calls[0].arguments["to"] = "mallory@evil.example"
        other_cp = checkpoint.model_copy(update={"checkpoint_id": "cp-1-00000000"})
        rejection = signed("alice", decision="reject")
        attacks = {
            "a typed name": ("alice", ""),
            "a key nobody trusts": ("alice", signed("mallory")),
            "mallory's key naming alice": ("alice", tampered(signed("mallory"), sub="alice")),
            "a rejection turned into an approval": ("alice", tampered(rejection, decision="approve")),
            "other arguments": ("alice", signed("alice", other_args)),
            "another checkpoint": ("alice", signed("alice", other_cp)),
            "another request": ("alice", signed("alice", workflow_id="req-another")),
            "an expired decision": ("alice", signed("alice", now=time.time() - 3600)),
            "a decision from the future": ("alice", signed("alice", now=time.time() + 3600)),
            "a name other than the signer's": ("bob", signed("alice")),
            "the 'none' algorithm": ("alice", issued(keys.own["alice"], {}, alg="none").rsplit(".", 1)[0] + "."),
            "the issuer's key as a reviewer's": (
                "alice",
                issued(keys.issuer, issuer_claims(wid, checkpoint, "alice", iss=review_proof.REVIEWER_ISSUER)),
            ),
            "an issuer token for another audience": (
                "carol",
                issued(keys.issuer, issuer_claims(wid, checkpoint, "carol", aud="someone-else")),
            ),
            "garbage": ("alice", "not.a.token"),
        }
        reasons = {}
        for attack, (name, proof) in attacks.items():
            cause = await refused_update(handle, checkpoint_id=cp, reviewer=name, decision="approve", proof=proof)
            reasons[attack] = cause.message
        assert reasons == {
            "a typed name": "this pipeline verifies reviewers: a decision must be signed (agent-lifecycle "
            "approve/reject with AGENT_REVIEWER_KEY, or a token from a trusted issuer)",
            "a key nobody trusts": f"the proof is signed with key {keys.own['mallory'].kid!r}, which this pipeline "
            "does not trust",
            "mallory's key naming alice": f"the proof is signed with key {keys.own['mallory'].kid!r}, which this "
            "pipeline does not trust",
            "a rejection turned into an approval": "the proof's signature does not verify with key "
            f"{keys.own['alice'].kid!r}",
            "other arguments": "the proof was signed for other calls than the checkpoint's (its arguments changed, "
            "or the reviewer saw others)",
            "another checkpoint": "the proof was signed for another checkpoint",
            "another request": "the proof was signed for another request",
            "an expired decision": "the proof has expired",
            "a decision from the future": "the proof is issued in the future",
            "a name other than the signer's": "the message names reviewer 'bob' but its proof is 'alice''s",
            "the 'none' algorithm": f"key {keys.own['alice'].kid!r} signs with EdDSA, not 'none'",
            "the issuer's key as a reviewer's": "the proof's issuer is 'agent-lifecycle/reviewer', not "
            "'https://sso.test' (key 'sso-2026')",
            "an issuer token for another audience": "the proof is not for 'agent-lifecycle/review'",
            "garbage": "the proof is not a compact JWS: a part is not base64url JSON",
        }

        # A signal that proves nothing changes nothing either; the record keeps it with who sent it.
        await handle.signal("approve", ApproveSignal(checkpoint_id=cp, reviewer="alice"))

        async def signal_ignored():
            record = await live_record(handle)
            return record.ignored_reviews or None

        [ignored] = await eventually(signal_ignored, what="the unsigned signal to be recorded")
        assert (ignored.via, ignored.reviewer, ignored.sent_as) == ("approve", "alice", client.identity)
        assert ignored.reason.startswith("this pipeline verifies reviewers: a decision must be signed")
        assert await handle.query("pending_checkpoint", result_type=Checkpoint | None) == checkpoint
        assert executed(await handle.fetch_history()) == []

        # Alice's own signed approval of the calls she was shown: accepted, once.
        proof = signed("alice", comment="checked")
        ack = await handle.execute_update(
            "review",
            ReviewRequest(checkpoint_id=cp, decision="approve", comment="checked", proof=proof),
            result_type=ReviewAck,
        )
        assert (ack.reviewer, ack.verified_by) == ("alice", f"key {keys.own['alice'].kid} of alice")
        again = await refused_update(handle, checkpoint_id=cp, decision="approve", comment="checked", proof=proof)
        assert again.message == f"checkpoint {cp!r} is already approved"
        out = await h.finish(handle)

    assert out.failure is None
    assert tool_step_ids(out) == ["notify"]
    assert [(m["to"], m["text"]) for m in outbox(tmp_path)] == [("carol", "hello")]
    [decided] = out.record.checkpoints
    assert (decided.status.value, decided.reviewer, decided.comment) == ("approved", "alice", "checked")
    assert decided.verified_by == f"key {keys.own['alice'].kid} of alice"
    assert decided.calls_digest == checkpoint.calls_digest
    assert [(i.via, i.reviewer) for i in out.record.ignored_reviews] == [("approve", "alice")]


async def test_a_trusted_issuers_token_speaks_for_the_reviewer_it_names(client, tmp_path, leftovers):
    keys = Keys(tmp_path)
    planner = FixedPlanner(message("notify", "carol", "hello"))
    review = keys.review(reviewers=["alice", "carol"])
    async with Harness(client, tmp_path, planner=planner, review=review) as h:
        handle = await start(h, leftovers)
        checkpoint = await h.wait_for_checkpoint(handle)
        cp = checkpoint.checkpoint_id
        dave = issued(keys.issuer, issuer_claims(handle.id, checkpoint, "dave"))
        refused = await refused_update(handle, checkpoint_id=cp, decision="approve", proof=dave)
        assert refused.message == "reviewer 'dave' may not review this pipeline's checkpoints"
        lifetime = issuer_claims(handle.id, checkpoint, "carol", exp=int(time.time()) + 3 * 24 * 3600)
        refused = await refused_update(
            handle, checkpoint_id=cp, decision="approve", proof=issued(keys.issuer, lifetime)
        )
        assert refused.message == f"the proof claims a life over {review_proof.MAX_TOKEN_LIFETIME_SECONDS} s"
        carol = issued(keys.issuer, issuer_claims(handle.id, checkpoint, "carol", decision="reject"))
        # The token decides only what it says: not an approval, only carol's rejection (with no comment).
        refused = await refused_update(handle, checkpoint_id=cp, decision="approve", proof=carol)
        assert refused.message == "the proof was signed for another decision"
        refused = await refused_update(handle, checkpoint_id=cp, decision="reject", comment="no!", proof=carol)
        assert refused.message == "the proof was signed for another comment"
        ack = await handle.execute_update(
            "review", ReviewRequest(checkpoint_id=cp, decision="reject", proof=carol), result_type=ReviewAck
        )
        assert (ack.reviewer, ack.verified_by) == ("carol", f"issuer {ISSUER} key sso-2026")
        out = await h.finish(handle)

    assert out.failure is not None and out.failure.type == "CheckpointRejected"
    assert executed(out.history) == [] and outbox(tmp_path) == []
    [decided] = out.record.checkpoints
    assert (decided.status.value, decided.reviewer, decided.verified_by) == (
        "rejected",
        "carol",
        f"issuer {ISSUER} key sso-2026",
    )


async def test_the_requester_may_not_approve_their_own_request(client, tmp_path, leftovers):
    keys = Keys(tmp_path)
    planner = FixedPlanner(message("notify", "carol", "hello"))
    async with Harness(client, tmp_path, planner=planner, review=keys.review()) as h:
        mine = await start(h, leftovers, requested_by="alice")
        by_metadata = await start(h, leftovers, metadata={"user_id": "bob"})
        for handle, requester, other in ((mine, "alice", "bob"), (by_metadata, "bob", "alice")):
            checkpoint = await h.wait_for_checkpoint(handle)
            own = sign_decision(
                keys.own[requester], checkpoint, workflow_id=handle.id, decision="approve", reviewer=requester
            )
            refused = await refused_update(
                handle, checkpoint_id=checkpoint.checkpoint_id, decision="approve", proof=own
            )
            assert (
                refused.message == f"{requester!r} requested this request and may not approve it (a second person must)"
            )
            second = sign_decision(
                keys.own[other], checkpoint, workflow_id=handle.id, decision="approve", reviewer=other
            )
            ack = await handle.execute_update(
                "review",
                ReviewRequest(checkpoint_id=checkpoint.checkpoint_id, decision="approve", proof=second),
                result_type=ReviewAck,
            )
            assert ack.reviewer == other
            out = await h.finish(handle)
            assert out.failure is None and tool_step_ids(out) == ["notify"]
        assert out.record is not None and (await live_record(mine)).requested_by == "alice"

    # A pipeline that allows it lets the requester approve their own request.
    async with Harness(client, tmp_path / "self", planner=planner, review=keys.review(allow_self_approval=True)) as h:
        handle = await start(h, leftovers, requested_by="alice")
        checkpoint = await h.wait_for_checkpoint(handle)
        own = sign_decision(keys.own["alice"], checkpoint, workflow_id=handle.id, decision="approve", reviewer="alice")
        ack = await handle.execute_update(
            "review",
            ReviewRequest(checkpoint_id=checkpoint.checkpoint_id, decision="approve", proof=own),
            result_type=ReviewAck,
        )
        assert ack.reviewer == "alice"
        assert (await h.finish(handle)).failure is None


async def test_the_servers_identity_is_the_reviewer_where_the_pipeline_trusts_it(client, tmp_path, leftovers):
    planner = FixedPlanner(message("notify", "carol", "hello"))
    review = ReviewSettings(verification="server_identity", reviewers=["alice@corp"])
    alice = await Client.connect(
        client.service_client.config.target_host,
        namespace=client.namespace,
        data_converter=client.data_converter,
        identity="alice@corp",
    )
    async with Harness(client, tmp_path, planner=planner, review=review) as h:
        handle = await start(h, leftovers, requested_by="bob@corp")
        checkpoint = await h.wait_for_checkpoint(handle)
        cp = checkpoint.checkpoint_id
        # This test's own client types alice's name: the server received it as someone else.
        refused = await refused_update(handle, checkpoint_id=cp, reviewer="alice@corp", decision="approve")
        assert refused.message == f"the message names reviewer 'alice@corp' but was sent as {client.identity!r}"
        refused = await refused_update(handle, checkpoint_id=cp, decision="approve")
        assert refused.message == f"reviewer {client.identity!r} may not review this pipeline's checkpoints"
        ack = await alice.get_workflow_handle(handle.id).execute_update(
            "review", ReviewRequest(checkpoint_id=cp, decision="approve", comment="ok"), result_type=ReviewAck
        )
        assert (ack.reviewer, ack.verified_by) == ("alice@corp", "server identity")
        out = await h.finish(handle)

    assert out.failure is None and tool_step_ids(out) == ["notify"]
    [decided] = out.record.checkpoints
    assert (decided.reviewer, decided.verified_by) == ("alice@corp", "server identity")
