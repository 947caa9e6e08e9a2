"""Arguments the commands share, checked before any work: programs, sources, devices, output files, references."""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from pathlib import Path

from toolkit.cli.terminal import say
from toolkit.core.errors import ToolkitError


def _package_name(path: Path) -> str | None:
    """The dotted name of a .py file inside a package folder (one holding ``__init__.py``, up to the
    first folder that holds none), None for a file outside any package."""
    if not path.stem.isidentifier():
        return None
    parts = [path.stem]
    folder = path.parent
    while (folder / "__init__.py").is_file() and folder.name.isidentifier():
        parts.insert(0, folder.name)
        folder = folder.parent
    return ".".join(parts) if len(parts) > 1 else None


def _import_from_package(path: Path, dotted: str):
    """``path`` imported as ``dotted``, a module of its package (so its relative imports work), with the
    package's parent folder on sys.path for the import only."""
    top = str(path.parents[dotted.count(".")])
    sys.path.insert(0, top)
    try:
        mod = importlib.import_module(dotted)
    finally:
        sys.path.remove(top)
    if Path(mod.__file__ or "").resolve() != path:
        raise ToolkitError(
            f"{path}: its package's name {dotted!r} is taken by another module ({mod.__file__}); "
            "run from another folder or rename the package"
        )
    return mod


def load_source_module(source: str):
    """A program's source, defining ``methods()``: a sample name, a .py file (one in a package folder
    imported as a module of that package), or an importable module."""
    from toolkit.build.samples import sample_module, sample_names

    path = Path(source)
    if path.suffix != ".py" and source in sample_names():
        mod = sample_module(source)
    elif path.suffix == ".py":
        if not path.is_file():
            raise ToolkitError(f"{path}: no such file")
        path = path.resolve()
        dotted = _package_name(path)
        try:
            if dotted is not None:
                mod = _import_from_package(path, dotted)
            else:
                spec = importlib.util.spec_from_file_location(path.stem, path)
                mod = importlib.util.module_from_spec(spec)
                spec.loader.exec_module(mod)
        except ToolkitError:
            raise
        except Exception as e:  # the user's file: say which and why, in one line
            raise ToolkitError(f"{source}: running it failed: {type(e).__name__}: {e}") from None
    else:
        try:
            mod = importlib.import_module(source)
        except ImportError as e:
            raise ToolkitError(f"{source}: not a .py file and not an importable module ({e})") from None
        except Exception as e:
            raise ToolkitError(f"{source}: importing it failed: {type(e).__name__}: {e}") from None
    if not callable(getattr(mod, "methods", None)):
        raise ToolkitError(f"{source}: defines no methods() returning {{name: (module, example_args)}}")
    return mod


def program_from(ref: str, device: str | None, constant_table: str | None = None, *, real_load: bool = False):
    """The program ``ref`` names; for a real load (``real_load``) a generation-1/2 ``.pte`` on a CUDA device
    has its constant tables read from (or checked against) its ``.so`` files, after the native-code notice."""
    from toolkit.build.samples import build_sample, sample_names
    from toolkit.sources import open_program

    if Path(ref).exists():  # a program directory, or a file of another format (.pte, .pt2)
        options = {"constant_table": constant_table} if constant_table else {}
        if real_load:
            from types import SimpleNamespace

            from toolkit.cli.terminal import say_native_code
            from toolkit.workflows.constant_tables import open_for_load

            named = SimpleNamespace(name=Path(ref).stem, root=Path(ref).resolve().parent)
            return open_for_load(ref, device, notice=lambda: say_native_code(named), **options)
        return open_program(ref, **options)
    if ref in sample_names():
        kind = "cuda" if device and device.startswith("cuda") else "cpu"
        return build_sample(ref, device=kind, progress=True)
    raise ToolkitError(f"{ref}: neither a program (directory, .pte or .pt2) nor a sample ({', '.join(sample_names())})")


def check_device(device: str | None) -> None:
    from toolkit.runtimes import parse_device

    if device is not None:
        parse_device(device)  # ValueError naming the choices


def check_output_option(path: str | None, force: bool, option: str = "--csv", follow_links: bool = False) -> None:
    """Refuse an output file (``option``) before any work, in one line naming it: empty, a folder,
    a device or FIFO, a missing or unwritable folder, a name the file system refuses, a file
    (without --force) or a symbolic link (without --follow-links)."""
    from toolkit.reports.output import CLI_SWITCHES, check_output

    if path is None:
        return
    if not path.strip():
        raise ToolkitError(f"{option}: an empty path")
    if os.path.isdir(path):  # False on any OSError: check_output names that error
        raise ToolkitError(f"{option} {path}: is a folder; give a file name inside it")
    try:
        check_output(path, overwrite=force, follow_links=follow_links, switches=CLI_SWITCHES)
    except ToolkitError as e:
        raise ToolkitError(f"{option} {e}") from None


def output_options(a) -> dict:
    """How the commands write --csv, --html and --junit: only what the checks before the work allowed
    (a file that appeared or a link planted since is refused then too)."""
    return {"overwrite": a.force, "follow_links": a.follow_links}


def check_reports(a) -> None:
    """--html and --junit, checked as --csv is, and each report a file of its own (else the second
    written would replace the first, or be refused as existing)."""
    check_output_option(a.html, a.force, "--html", a.follow_links)
    check_output_option(a.junit, a.force, "--junit", a.follow_links)
    seen: dict[str, str] = {}
    for option, path in (("--csv", a.csv), ("--html", a.html), ("--junit", a.junit)):
        if path:
            key = os.path.realpath(path) if a.follow_links else os.path.abspath(path)
            if key in seen:
                raise ToolkitError(f"{option} {path}: the same file as {seen[key]}; give each report a file of its own")
            seen[key] = option


def write_reports(a, verdicts, html_of, labels=None, unreadable=None) -> None:
    """The HTML report (``html_of()`` builds it) and the JUnit XML the options ask for."""
    from toolkit.reports.junit import junit_xml
    from toolkit.reports.output import CLI_SWITCHES, write_text_atomically

    how = {**output_options(a), "switches": CLI_SWITCHES}
    if a.html:
        write_text_atomically(a.html, html_of(), **how)
        say(f"HTML report written to {Path(a.html).resolve()}")
    if a.junit:
        write_text_atomically(a.junit, junit_xml(verdicts, labels=labels, unreadable=unreadable), **how)
        say(f"JUnit XML written to {Path(a.junit).resolve()}")


def references_from(items: list[str] | None) -> dict[str, str] | None:
    """``--reference METHOD=FILE`` (repeated) -> {method: file}; checked before any work."""
    if not items:
        return None
    out: dict[str, str] = {}
    for item in items:
        method, sep, path = item.partition("=")
        if not sep or not method or not path:
            raise ToolkitError(f"--reference {item!r}: give METHOD=FILE.safetensors")
        if method in out:
            raise ToolkitError(f"--reference: method {method!r} given twice")
        if not Path(path).is_file():
            raise ToolkitError(f"--reference {item}: {path!r} is not a file")
        out[method] = path
    return out
