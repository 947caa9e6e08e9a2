"""ipywidgets and itables for the explorer's view, imported only when a view is made: the import
with its install hint, itables' grid widget when it is installed, and closing a widget whole.
"""

from __future__ import annotations


def require_ipywidgets():
    """The ipywidgets module, or an ImportError that says how to install it."""
    try:
        import ipywidgets
    except ImportError:  # pragma: no cover - depends on the environment
        raise ImportError("the explorer needs ipywidgets 8: pip install 'constshare-toolkit[notebook]'") from None
    return ipywidgets


def itable_class():
    """itables' ITable widget (sortable, searchable, paginated, row selection), or None."""
    try:
        from itables.widget import ITable
    except ImportError:
        return None
    return ITable


def close_widget(obj) -> None:
    """Close a widget and its layout and style (widgets of their own, with their own comms)."""
    for part in (getattr(obj, "layout", None), getattr(obj, "style", None)):
        if part is not None and hasattr(part, "close"):
            part.close()
    obj.close()
