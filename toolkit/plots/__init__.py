"""Plots of loads and policy comparisons (matplotlib and plotly, imported when something is drawn).

Every function draws on the ``ax`` it is given (or on a fresh Figure) and returns the Figure.
None of them calls ``show()`` or saves a file, and none of them runs anything: whatever needs
running (``session.verify()``, :func:`toolkit.compare_policies`) is passed in.  Text that comes
from the program is drawn literally (:func:`~toolkit.plots.figure.plain_text`,
:func:`~toolkit.plots.interactive.plotly_text`).  Colours come from :mod:`toolkit.display.palette`.
An interactive (plotly) figure also carries a static PNG in its display data
(:mod:`toolkit.plots.static`), so nbconvert, GitHub and a PDF export show it too.
"""

from toolkit.plots.figure import figure_png, plain_text
from toolkit.plots.interactive import interactive_collision_matrix, plotly_bundle, plotly_text
from toolkit.plots.matrix import collision_matrix
from toolkit.plots.matrix_view import MatrixView, collision_matrix_data, collision_matrix_view, culprit_cells
from toolkit.plots.memory import memory_by_policy, minimum_device_bytes
from toolkit.plots.timeline import event_timeline
from toolkit.plots.tradeoff import policy_tradeoff

__all__ = [
    "MatrixView",
    "collision_matrix",
    "collision_matrix_data",
    "collision_matrix_view",
    "culprit_cells",
    "event_timeline",
    "figure_png",
    "interactive_collision_matrix",
    "memory_by_policy",
    "minimum_device_bytes",
    "plain_text",
    "plotly_bundle",
    "plotly_text",
    "policy_tradeoff",
]
