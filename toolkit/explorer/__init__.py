"""The notebook explorer: pick a program, a policy and a device, load, and browse what happened.

:class:`ExplorerState` is the model (traitlets, testable without a browser or a kernel);
:class:`Explorer` is its ipywidgets view.  Everything it says about right and wrong is the
session's verdict (a dry run's: the prediction, said so).  ipywidgets, itables and matplotlib are
imported when a view or figure is made.
"""

from toolkit.explorer.browsing import ALL
from toolkit.explorer.devices import NO_CUDA
from toolkit.explorer.exports import safe_file_name
from toolkit.explorer.findings import (
    COLLISION,
    CULPRIT_RANK,
    OF_A_WRONG_METHOD,
    OTHER,
    RUNS_ON_OTHER_DATA,
    findings_summary,
    interest_rank,
)
from toolkit.explorer.grid import count_text, grid_frame
from toolkit.explorer.loading import DRAW_SPAN, LOAD_SPAN
from toolkit.explorer.markup import MAX_INLINE_EXPORT, comparison_display
from toolkit.explorer.panels import DECISIONS_TAB
from toolkit.explorer.state import ExplorerState
from toolkit.explorer.view import Explorer

__all__ = [
    "ALL",
    "COLLISION",
    "CULPRIT_RANK",
    "DECISIONS_TAB",
    "DRAW_SPAN",
    "LOAD_SPAN",
    "MAX_INLINE_EXPORT",
    "NO_CUDA",
    "OF_A_WRONG_METHOD",
    "OTHER",
    "RUNS_ON_OTHER_DATA",
    "Explorer",
    "ExplorerState",
    "comparison_display",
    "count_text",
    "findings_summary",
    "grid_frame",
    "interest_rank",
    "safe_file_name",
]
