"""The search attributes a request sets so operators can find it (``temporal workflow list --query``)."""

from temporalio.common import SearchAttributeKey

LIFECYCLE_STAGE = SearchAttributeKey.for_keyword("AgentLifecycleStage")
AWAITING_REVIEW = SearchAttributeKey.for_bool("AgentAwaitingReview")
ALL = (LIFECYCLE_STAGE, AWAITING_REVIEW)
# The visibility query of a reviewer's inbox.
AWAITING_REVIEW_QUERY = (
    "WorkflowType = 'RequestLifecycle' AND AgentAwaitingReview = true AND ExecutionStatus = 'Running'"
)
