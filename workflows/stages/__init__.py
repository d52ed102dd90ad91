"""The stages of a request, each declared once: its call and outcome models, its hook Protocol, what its
activity checks of a hook's return value and how an outcome folds into the request (a ``StageSpec``).

The registry validates hooks against the stage Protocols, the worker registers one activity per stage
(``<stage>_hook``, all with one body), and the workflow runs every stage's hooks with one runner that
folds each outcome in with the stage's own rule. Adding a stage is a member of ``Stage``, one spec in
the module of its family, and the call site in the workflow.
"""

from __future__ import annotations

from ..models import Stage
from . import answer, execution, planning, run
from ._base import HOOK_BATCH_ACTIVITY as HOOK_BATCH_ACTIVITY
from ._base import STAGE_SEPARATOR as STAGE_SEPARATOR
from ._base import Chaining as Chaining
from ._base import Checks as Checks
from ._base import Fold as Fold
from ._base import ResultRejected as ResultRejected
from ._base import StageSpec as StageSpec
from ._base import hands_on as hands_on
from ._base import hook_activity_type as hook_activity_type
from ._base import hook_stage_of as hook_stage_of
from ._base import let_through as let_through
from ._base import next_call as next_call
from ._base import returned as returned
from ._base import stages_activity_type as stages_activity_type
from .answer import *  # noqa: F403
from .answer import STAND_IN_ANSWER as STAND_IN_ANSWER
from .answer import answered as answered
from .execution import *  # noqa: F403
from .planning import *  # noqa: F403
from .run import *  # noqa: F403

# What ``hooks`` re-exports: each family's hook Protocols and the values its hooks return.
__all__: list[str] = []
__all__ += answer.__all__
__all__ += execution.__all__
__all__ += planning.__all__
__all__ += run.__all__

_FAMILIES = (run, planning, execution, answer)
STAGES: dict[Stage, StageSpec] = dict(
    sorted(
        ((spec.stage, spec) for family in _FAMILIES for spec in vars(family).values() if isinstance(spec, StageSpec)),
        key=lambda item: list(Stage).index(item[0]),
    )
)
assert list(STAGES) == list(Stage), "every stage is declared once, in the module of its family"

# Derived views of the stages.
STAGE_PROTOCOLS: dict[str, type] = {method: p for spec in STAGES.values() for method, p in spec.protocols.items()}
STAGE_METHODS: dict[str, Stage] = {method: spec.stage for spec in STAGES.values() for method in spec.methods}
TOOL_STAGES = frozenset(s for s, spec in STAGES.items() if spec.tool_stage)
FINALIZER_STAGES = frozenset(s for s, spec in STAGES.items() if spec.finalizer)
OWN_POLICY_STAGES = frozenset(s for s, spec in STAGES.items() if spec.own_policy)
