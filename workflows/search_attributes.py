"""The search attributes a request sets so operators can find it (``temporal workflow list --query``)."""

from temporalio.common import SearchAttributeKey

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
# The visibility query of a reviewer's inbox.
AWAITING_REVIEW_QUERY = (
    "WorkflowType = 'RequestLifecycle' AND AgentAwaitingReview = true AND ExecutionStatus = 'Running'"
)
# The list filter that shows what clients asked, without sub-agent or detached-effect children.
REQUESTS_QUERY = "AgentWorkflowKind = 'request'"
# Conversations, without their turns.
CONVERSATIONS_QUERY = "AgentWorkflowKind = 'conversation'"
