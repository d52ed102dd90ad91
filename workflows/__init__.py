"""Deterministic workflow code and the models every other part shares."""

from .converter import data_converter
from .lifecycle import WORKFLOW_TYPE, RequestLifecycleWorkflow, idempotency_key

__all__ = ["WORKFLOW_TYPE", "RequestLifecycleWorkflow", "data_converter", "idempotency_key"]
