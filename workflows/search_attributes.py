"""The search attributes a request sets so operators can find it (``temporal workflow list --query``)."""

from temporalio.common import SearchAttributeKey, SearchAttributePair, TypedSearchAttributes

LIFECYCLE_STAGE = SearchAttributeKey.for_keyword("AgentLifecycleStage")
AWAITING_REVIEW = SearchAttributeKey.for_bool("AgentAwaitingReview")
# What an execution is: ``request`` (what a client asked), ``subagent`` (a child request a plan step
# delegated to), ``detached_effect`` (a child carrying a hook's detached work), ``review_notification``
# (a child telling the reviewers' webhook that a checkpoint opened) or ``lease_keeper`` (a child renewing
# a managed lease of a request that runs longer than the lease's renew interval) or ``conversation`` (the
# entity that runs the turns of one conversation one at a time).
WORKFLOW_KIND = SearchAttributeKey.for_keyword("AgentWorkflowKind")
KIND_REQUEST = "request"
KIND_SUBAGENT = "subagent"
KIND_DETACHED_EFFECT = "detached_effect"
KIND_REVIEW_NOTIFICATION = "review_notification"
KIND_LEASE_KEEPER = "lease_keeper"
KIND_CONVERSATION = "conversation"
ALL = (LIFECYCLE_STAGE, AWAITING_REVIEW, WORKFLOW_KIND)
# The stage a request is in from its start: resolving its hook pipeline.
STAGE_AT_START = "resolve_pipeline"


def listed_at_start(kind: str = KIND_REQUEST) -> TypedSearchAttributes:
    """The search attributes to start a request with: its kind and first stage. A request started with
    them is listed from its start and costs no upsert to be found; its later stages are listed as the
    stage listing delay says."""
    return TypedSearchAttributes(
        [SearchAttributePair(WORKFLOW_KIND, kind), SearchAttributePair(LIFECYCLE_STAGE, STAGE_AT_START)]
    )


# The visibility query of a reviewer's inbox.
AWAITING_REVIEW_QUERY = (
    "WorkflowType = 'RequestLifecycle' AND AgentAwaitingReview = true AND ExecutionStatus = 'Running'"
)
# The list filter that shows what clients asked, without sub-agent or detached-effect children.
REQUESTS_QUERY = "AgentWorkflowKind = 'request'"
# Conversations, without their turns.
CONVERSATIONS_QUERY = "AgentWorkflowKind = 'conversation'"
