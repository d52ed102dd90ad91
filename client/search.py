"""Make sure the lifecycle search attributes exist on the namespace before workers rely on them."""

from __future__ import annotations

import logging

from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.operatorservice.v1 import AddSearchAttributesRequest, ListSearchAttributesRequest
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from workflows import search_attributes

from .retrying import retrying

logger = logging.getLogger(__name__)


async def ensure_search_attributes(client: Client, namespace: str, *, wait_seconds: float = 0.0) -> bool:
    """Register any missing lifecycle search attribute. Returns whether all of them are available; when
    they are not (no operator permission, a server without custom attributes) requests still run, they
    are just not listed by stage or review state. A server that is unavailable for a moment (restarting)
    is asked again for up to ``wait_seconds``, so such a moment does not cost the process its attributes
    for the rest of its life."""
    wanted = {key.name: IndexedValueType.ValueType(key.indexed_value_type) for key in search_attributes.ALL}

    async def register() -> None:
        listed = await client.operator_service.list_search_attributes(ListSearchAttributesRequest(namespace=namespace))
        missing = {name: kind for name, kind in wanted.items() if name not in listed.custom_attributes}
        if missing:
            await client.operator_service.add_search_attributes(
                AddSearchAttributesRequest(namespace=namespace, search_attributes=missing)
            )
            logger.info("registered search attributes %s", ", ".join(sorted(missing)))

    try:
        await retrying(
            register,
            transient=lambda err: isinstance(err, RPCError) and err.status is RPCStatusCode.UNAVAILABLE,
            within=wait_seconds,
            waiting="Temporal is unavailable; asking again for the search attributes",
        )
    except RPCError as err:
        logger.warning("lifecycle search attributes unavailable (%s); the review inbox will be empty", err.message)
        return False
    return True
