"""Pipeline-stage placement next to the NIC: cheapest stage order over the topology's routes.

``stages`` searches the placements (exact DP or heuristic) and scores them; ``chains`` builds the
cheapest GPU chains inside one node that it combines.
"""

from __future__ import annotations

from taccl_py.placement.stages import (
    DEFAULT_ACTIVATION_BYTES,
    EXACT_MAX_GPUS_PER_NODE,
    PlacementHop,
    PlacementResult,
    pipeline_time_us,
    place_pipeline,
    stage_cost_matrix_us,
)

__all__ = [
    "DEFAULT_ACTIVATION_BYTES",
    "EXACT_MAX_GPUS_PER_NODE",
    "PlacementHop",
    "PlacementResult",
    "pipeline_time_us",
    "place_pipeline",
    "stage_cost_matrix_us",
]
