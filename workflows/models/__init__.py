"""Messages and records shared by the workflow, its activities, the hooks and the client.

Everything here is a pydantic model that crosses a Temporal boundary (workflow input/result, activity
inputs/results, queries) or is stored in the execution record. The package imports nothing heavier than
pydantic so the workflow sandbox can load it. Its modules are private: each names what it exports in
``__all__`` and this ``__init__``, the API, re-exports exactly those names.
"""

from __future__ import annotations

from . import (
    _activity_io,
    _common,
    _conversation,
    _hook_calls,
    _model_calls,
    _pipeline,
    _plans,
    _record,
    _replay,
    _request,
)
from ._activity_io import *
from ._common import *
from ._conversation import *
from ._hook_calls import *
from ._model_calls import *
from ._pipeline import *
from ._plans import *
from ._record import *
from ._replay import *
from ._request import *

__all__: list[str] = []
__all__ += _activity_io.__all__
__all__ += _common.__all__
__all__ += _conversation.__all__
__all__ += _hook_calls.__all__
__all__ += _model_calls.__all__
__all__ += _pipeline.__all__
__all__ += _plans.__all__
__all__ += _record.__all__
__all__ += _replay.__all__
__all__ += _request.__all__
