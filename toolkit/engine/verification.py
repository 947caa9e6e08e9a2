"""Verification: every loaded method run on its eager reference inputs, outputs compared.

References come from the program (our directories store them at build time; a ``.pte``
may have ``reference_<method>.safetensors`` beside it) or from the caller
(``session.verify(references={...})``, see :func:`resolve_references`): a mapping of
inputs and outputs, a safetensors file, or the original module and its inputs to compute
them from.  A method with neither is reported ``no reference``: not run, ``ok`` missing
(``pd.NA``), neither right nor wrong.
"""

from __future__ import annotations

import copy
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Collection, Mapping

import pandas as pd
import torch

from toolkit.core.errors import ProgramError, ReferenceDataError, ToolkitError
from toolkit.core.model import MethodSpec, Program
from toolkit.core.vocab import CheckedAgainst, ConstantKind, Oracle, ProgramFormat, parse
from toolkit.engine.inputs import generate

if TYPE_CHECKING:
    from toolkit.engine.loader import ProgramLoad as Session

VERIFY_COLUMNS = ["method", "ran", "max_abs_err", "atol", "rtol", "ok", "reason", "oracle", "oracle_detail", "draws"]
SEQUENCE_COLUMNS = ["sequence", "step", *VERIFY_COLUMNS]
# the reason of a method nothing can be checked against; its ``ok`` is pd.NA (neither ok nor wrong)
NO_REFERENCE = "no reference"

UNSHARED_POLICY = "no-sharing"  # the unshared side of the differential oracle: each method on its own bytes


def dtype_tolerance(dtype: torch.dtype) -> tuple[float, float]:
    """(atol, rtol) fitting the output dtype: compiled kernels reorder reductions."""
    if dtype in (torch.bfloat16,):
        return 5e-2, 5e-2
    if dtype in (torch.float16,):
        return 1e-2, 1e-2
    if dtype.is_floating_point or dtype.is_complex:
        return 1e-3, 1e-3
    return 0.0, 0.0


def _read_checked(program: Program, rel: str, check_integrity: bool) -> tuple[dict[str, torch.Tensor], "Path"]:
    """The tensors of a reference file (safetensors, never pickle), its digest checked first."""
    from safetensors.torch import load_file

    from toolkit.integrity import verified_files

    path = program.path(rel)
    record = program.files.get(rel)
    # checked: read from the verified copy (what was hashed is what is read)
    source = verified_files().copy(path, record).path if check_integrity and record is not None else path
    try:
        return load_file(str(source)), path
    except Exception as e:
        raise ProgramError(f"reference tensors cannot be read: {e}", path=path) from None


def read_reference(
    program: Program, spec: MethodSpec, *, check_integrity: bool = True
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """(inputs, outputs) stored at build time in the method's reference file (safetensors, never pickle).

    The file is checked against its recorded digest first, as the load checks its files
    (free when it is unchanged since): a reference copied over another after the load
    would make a correct method look wrong.  A method whose program holds no reference
    (a ``.pt2``, a ``.pte`` without ``reference_<method>.safetensors``) raises
    :class:`~toolkit.core.errors.ReferenceDataError`: pass ``references=`` to ``verify()``.
    """
    if not spec.reference_file:
        raise ReferenceDataError(
            f"method {spec.name!r} has no reference in the program: pass session.verify(references={{...}})",
            path=program.root,
            field=f"methods[{spec.name}].reference_file",
        )
    data, path = _read_checked(program, spec.reference_file, check_integrity)
    try:
        inputs = [data[f"input.{i}"] for i in range(spec.num_inputs)]
        outputs = [data[f"output.{i}"] for i in range(spec.num_outputs)]
    except KeyError as e:
        raise ProgramError(f"reference tensor {e.args[0]!r} is missing", path=path) from None
    return inputs, outputs


def _abs_error(o: torch.Tensor, e: torch.Tensor) -> tuple[float, tuple[torch.Tensor, torch.Tensor] | None, int]:
    """The largest ``|o - e|`` over the positions where both are finite, with those values (float64)
    and how many NaN/infinite values of ``e`` ``o`` matches (a NaN by a NaN, an infinity by one of
    its sign).  inf (and no values) when shape or dtype differ, or a NaN or an infinity is unmatched."""
    if o.shape != e.shape or o.dtype != e.dtype:
        return math.inf, None, 0
    o, e = o.double(), e.double()
    finite = torch.isfinite(o) & torch.isfinite(e)
    alike = (torch.isnan(o) & torch.isnan(e)) | (torch.isinf(o) & (o == e))
    matched = int(alike.sum())
    if not bool((finite | alike).all()):
        return math.inf, None, matched
    of, ef = o[finite], e[finite]
    return (float((of - ef).abs().max()) if finite.any() else 0.0), (of, ef), matched


def compare_outputs(
    outputs: list[torch.Tensor], expected: list[torch.Tensor], against: str = "the eager reference"
) -> dict[str, Any]:
    """max_abs_err, atol, rtol, ok and reason of outputs against the reference.

    A NaN where the reference has NaN, and an infinity of the reference's sign, compare equal
    (``max_abs_err`` is taken over the other positions; the reason says how many there were);
    a NaN or an infinity anywhere else is wrong (``max_abs_err`` inf)."""
    errs, ok = [], len(outputs) == len(expected)
    atol, rtol, same_nonfinite = 0.0, 0.0, 0
    for o, e in zip(outputs, expected):
        a, r = dtype_tolerance(e.dtype)
        atol, rtol = max(atol, a), max(rtol, r)
        err, values, matched = _abs_error(o, e)
        errs.append(err)
        same_nonfinite += matched
        if values is None:
            ok = False
            continue
        ok &= bool(torch.allclose(*values, atol=a, rtol=r))
    reason = "" if ok else f"output differs from {against}"
    if same_nonfinite:
        reason += ("; " if reason else "") + (
            f"{same_nonfinite} NaN or infinite values where {against} has the same (compared equal)"
        )
    return {"max_abs_err": max(errs) if errs else 0.0, "atol": atol, "rtol": rtol, "ok": ok, "reason": reason}


# ------------------------------------------------------------------ supplied references


@dataclass(frozen=True)
class Reference:
    """One method's reference: its inputs in the method's own order, and the outputs eager gave."""

    inputs: tuple[torch.Tensor, ...]
    outputs: tuple[torch.Tensor, ...]
    given_as: str  # where it came from: "the program's file ...", "supplied", "safetensors file ...", "computed"
    supplied: bool = True  # given by the caller (not the program's own file)


def _field(method: str, *parts: str) -> str:
    return f"references[{method}]" + "".join(parts)


def _tensors(values: Any, method: str, what: str, path: Any = None) -> tuple[torch.Tensor, ...]:
    if isinstance(values, torch.Tensor):
        values = [values]
    if not isinstance(values, (list, tuple)):
        raise ReferenceDataError(
            f"{what} of method {method!r} must be a list of tensors, got {type(values).__name__}",
            path=path,
            field=_field(method, f".{what}"),
        )
    for i, t in enumerate(values):
        if not isinstance(t, torch.Tensor):
            raise ReferenceDataError(
                f"{what}[{i}] of method {method!r} is a {type(t).__name__}, not a tensor",
                path=path,
                field=_field(method, f".{what}[{i}]"),
            )
    return tuple(t.detach() for t in values)


def _from_file(method: str, path: "str | os.PathLike[str]") -> Reference:
    """``input.N`` / ``output.N`` tensors of a safetensors file (never pickle), as the builder writes them."""
    from safetensors.torch import load_file

    p = Path(path)
    if not p.is_file():
        raise ReferenceDataError(
            f"reference file of method {method!r} is not a readable file", path=p, field=_field(method)
        )
    try:
        data = load_file(str(p))
    except Exception as e:
        raise ReferenceDataError(f"reference tensors cannot be read: {e}", path=p, field=_field(method)) from None
    pat = re.compile(r"(input|output)\.(\d+)")
    found: dict[str, dict[int, torch.Tensor]] = {"input": {}, "output": {}}
    for k, t in data.items():
        m = pat.fullmatch(k)
        if m is None:
            raise ReferenceDataError(f"tensor {k!r} is neither input.N nor output.N", path=p, field=_field(method))
        found[m.group(1)][int(m.group(2))] = t
    out = {}
    for kind, got in found.items():
        missing = [i for i in range(len(got)) if i not in got]
        if missing:
            raise ReferenceDataError(
                f"{kind}.{missing[0]} is missing (the file has {sorted(got)})",
                path=p,
                field=_field(method, f".{kind}s[{missing[0]}]"),
            )
        out[kind] = tuple(got[i] for i in range(len(got)))
    return Reference(out["input"], out["output"], f"safetensors file {p}")


def _from_module(method: str, module: Any, args: Any) -> Reference:
    """Run the original module (a copy: state it writes stays as it was) on ``args``, as the builder does."""
    from torch.utils import _pytree as pytree

    if not isinstance(args, tuple):
        raise ReferenceDataError(
            f"the inputs given with the module of method {method!r} must be a tuple, got {type(args).__name__}",
            field=_field(method, ".inputs"),
        )
    inputs = _tensors(pytree.tree_flatten(args)[0], method, "inputs")
    mod = copy.deepcopy(module)
    if isinstance(mod, torch.nn.Module):
        mod.eval()
    try:
        with torch.no_grad():
            result = mod(*copy.deepcopy(args))
    except Exception as e:
        raise ReferenceDataError(
            f"running the module of method {method!r} failed: {type(e).__name__}: {e}", field=_field(method)
        ) from None
    outputs = _tensors(pytree.tree_flatten(result)[0], method, "outputs")
    return Reference(inputs, tuple(o.cpu() for o in outputs), "computed from the module given")


def _one(method: str, value: Any) -> Reference:
    if isinstance(value, Reference):
        return value
    if isinstance(value, (str, os.PathLike)):
        return _from_file(method, value)
    if isinstance(value, Mapping):
        extra = set(value) - {"inputs", "outputs"}
        if extra or not {"inputs", "outputs"} <= set(value):
            raise ReferenceDataError(
                f"a reference mapping has the keys 'inputs' and 'outputs', got {sorted(value)}", field=_field(method)
            )
        return Reference(
            _tensors(value["inputs"], method, "inputs"), _tensors(value["outputs"], method, "outputs"), "supplied"
        )
    if isinstance(value, (tuple, list)) and len(value) == 2:
        first, second = value
        if callable(first) and not isinstance(first, torch.Tensor):
            return _from_module(method, first, second)
        return Reference(_tensors(first, method, "inputs"), _tensors(second, method, "outputs"), "supplied")
    raise ReferenceDataError(
        f"a reference is {{'inputs': [...], 'outputs': [...]}}, (inputs, outputs), a safetensors file or "
        f"(module, example_args); got {type(value).__name__}",
        field=_field(method),
    )


def resolve_references(session: "Session", references: "Mapping[str, Any] | None") -> dict[str, Reference | None]:
    """method -> its reference (None: no reference), the supplied ones checked first.

    ``references`` maps a method name to one of: ``{"inputs": [...], "outputs": [...]}`` or
    ``(inputs, outputs)`` (tensors, in the method's own input order); a safetensors file
    (``input.N``, ``output.N``); or ``(module, example_args)``, run here (on a copy) to
    compute the outputs.  A supplied reference replaces the program's own file.  Refused
    with :class:`~toolkit.core.errors.ReferenceDataError` naming the method and field: an
    unknown method, a number of inputs or outputs the method does not have, a value that
    is not a tensor, or an input whose dtype or shape differs from the program's own
    reference.  (The compiled model checks shapes too when it runs: see :func:`verify_session`.)
    """
    program = session.program
    given = dict(references or {})
    unknown = [m for m in given if m not in program.method_names]
    if unknown:
        raise ReferenceDataError(
            f"references name method {unknown[0]!r}, which the program does not have; it has {program.method_names}",
            path=program.root,
            field=_field(str(unknown[0])),
        )
    out: dict[str, Reference | None] = {}
    for spec in program.methods:
        m = spec.name
        own = None
        if spec.reference_file:
            inputs, outputs = read_reference(program, spec, check_integrity=session.check_integrity)
            own = Reference(tuple(inputs), tuple(outputs), f"the program's file {spec.reference_file}", supplied=False)
        if m not in given:
            out[m] = own
            continue
        ref = _one(m, given[m])
        for what, got, want in (("inputs", ref.inputs, spec.num_inputs), ("outputs", ref.outputs, spec.num_outputs)):
            if len(got) != want:
                raise ReferenceDataError(
                    f"{len(got)} {what} given for method {m!r}, which has {want}",
                    path=program.root,
                    field=_field(m, f".{what}"),
                )
        if own is not None:  # the program's own reference says what the method takes
            for i, (t, o) in enumerate(zip(ref.inputs, own.inputs)):
                if t.dtype != o.dtype:
                    raise ReferenceDataError(
                        f"input {i} of method {m!r} is {t.dtype}, the method takes {o.dtype}",
                        path=program.root,
                        field=_field(m, f".inputs[{i}].dtype"),
                    )
                if tuple(t.shape) != tuple(o.shape):
                    raise ReferenceDataError(
                        f"input {i} of method {m!r} has shape {tuple(t.shape)}, the method takes {tuple(o.shape)}",
                        path=program.root,
                        field=_field(m, f".inputs[{i}].shape"),
                    )
        out[m] = ref
    return out


# AOTInductor's own input check (the .so's check_input_N, on when AOTI_RUNTIME_CHECK_INPUTS is set,
# which the AOTI runtime of this toolkit sets): "input_handles[0]: unmatched dim value at 1, ..."
_SO_INPUT_CHECK = re.compile(r"input_handles\[(\d+)\]: unmatched (dtype|dim value|stride value|device type)")
_CHECK_FIELD = {"dtype": "dtype", "dim value": "shape", "stride value": "strides", "device type": "device"}


def _so_input_problem(e: RuntimeError, spec: MethodSpec, method: str) -> ReferenceDataError | None:
    """The compiled model refused an input: which method input, which field."""
    m = _SO_INPUT_CHECK.search(str(e))
    if m is None:
        return None
    i = int(m.group(1))
    j = spec.input_order[i] if spec.input_order is not None and i < len(spec.input_order) else i
    first = str(e).strip().splitlines()[0]
    return ReferenceDataError(
        f"the compiled model of {method!r} refuses input {j}: {first}",
        field=_field(method, f".inputs[{j}].{_CHECK_FIELD[m.group(2)]}"),
    )


def _empty_row(**fields: Any) -> dict[str, Any]:
    return {
        "ran": False,
        "max_abs_err": math.nan,
        "atol": math.nan,
        "rtol": math.nan,
        "ok": False,
        "reason": "",
        "oracle": "",
        "oracle_detail": "",
        "draws": "",
        **fields,
    }


def verify_session(
    session: "Session",
    references: "Mapping[str, Any] | None" = None,
    *,
    oracle: str = "auto",
    draws: int = 3,
    seed: int = 0,
    methods: "Collection[str] | None" = None,
) -> pd.DataFrame:
    """One row per method of the program: did it run, how far from its oracle, ok?

    ``ok`` is a nullable boolean: True (matches), False (differs, or its run failed), or
    ``pd.NA`` where nothing was compared (no reference, not loaded, not runnable: ``reason``
    says which), neither ok nor wrong.  ``oracle`` (:class:`toolkit.core.vocab.Oracle`) says what a method is
    checked against, named per row (``oracle``, ``oracle_detail``): its reference (the
    program's or one in ``references``, see :func:`resolve_references`, checked before
    anything runs), or the same method loaded on its own bytes (:func:`differential_row`) on
    the reference's inputs or, where there is none, ``draws`` inputs generated from the
    program (:func:`toolkit.engine.inputs.generate`, ``seed``).  A supplied reference the compiled
    model refuses (another input shape or dtype), or whose outputs have another shape or dtype
    than the method's, raises :class:`~toolkit.core.errors.ReferenceDataError`.  ``methods``: only
    these rows (blame's experiments verify the wrong method alone).
    """
    oracle = parse(Oracle, oracle, what="oracle")
    refs = resolve_references(session, references) if references or oracle == "unshared" else None
    rows = []
    for spec in (m for m in session.program.methods if methods is None or m.name in methods):
        row = _empty_row(method=spec.name)
        lm = session.methods.get(spec.name)
        ref: Reference | None = None
        if refs is not None:
            ref = refs[spec.name]
        elif spec.reference_file:
            ref = Reference((), (), "", supplied=False)  # read below (errors become the row's reason)
        if lm is None or not lm.runnable:  # nothing ran: neither ok nor wrong (the verdict says why not)
            row["ok"] = pd.NA
            row["reason"] = (
                "not runnable (would-be out-of-bounds alias): " + "; ".join(lm.problems)
                if lm
                else "not loaded" + (f": {session.error}" if session.failed_method == spec.name else "")
            )
        elif oracle == "unshared" and ref is not None:
            row.update(
                differential_row(
                    session,
                    spec,
                    [list(ref.inputs)],
                    CheckedAgainst.UNSHARED_SUPPLIED_INPUTS
                    if ref.supplied
                    else CheckedAgainst.UNSHARED_REFERENCE_INPUTS,
                    f"inputs: {ref.given_as}",
                )
            )
        elif ref is None or oracle == "generated":
            generated = generate(session.program, spec, draws, seed) if oracle != "reference" else None
            if generated is not None:
                row.update(
                    differential_row(session, spec, generated[0], CheckedAgainst.UNSHARED_GENERATED, generated[1])
                )
            else:
                row["ok"] = pd.NA
                row["reason"] = (
                    f"{NO_REFERENCE}: the program holds none for {spec.name!r}"
                    + ("" if oracle == "reference" else " and does not declare its inputs")
                    + "; pass verify(references={...})"
                )
        else:
            row["oracle"] = CheckedAgainst.SUPPLIED if ref.supplied else CheckedAgainst.EAGER
            try:
                if ref.given_as:
                    inputs, expected = list(ref.inputs), list(ref.outputs)
                else:
                    inputs, expected = read_reference(session.program, spec, check_integrity=session.check_integrity)
                session.reset_state()  # each method alone, from the initial state
                try:
                    raw = session.run(spec.name, [x.contiguous() for x in inputs] if ref.supplied else inputs)
                except RuntimeError as e:
                    problem = _so_input_problem(e, spec, spec.name) if ref.supplied else None
                    if problem is not None:
                        raise problem from None
                    raise
                outputs = [o.detach().cpu() for o in raw]
                if ref.supplied:
                    for k, (o, x) in enumerate(zip(outputs, expected)):
                        if o.dtype != x.dtype or o.shape != x.shape:
                            raise ReferenceDataError(
                                f"output {k} of method {spec.name!r} is {o.dtype} {tuple(o.shape)}, the reference "
                                f"given is {x.dtype} {tuple(x.shape)}: not this method's output",
                                field=_field(spec.name, f".outputs[{k}]"),
                            )
                row["ran"] = True
                row.update(compare_outputs(outputs, [x.cpu() for x in expected]))
            except ReferenceDataError as e:
                if ref.supplied:
                    raise
                row["reason"] = str(e)
            except ToolkitError as e:
                row["reason"] = str(e)
            except RuntimeError as e:
                row["reason"] = _run_failed(e)
        rows.append(row)
    frame = pd.DataFrame(rows, columns=VERIFY_COLUMNS)
    frame["ok"] = frame["ok"].astype("boolean")
    return frame


def _first_line(e: BaseException) -> str:
    return str(e).splitlines()[0] if str(e) else type(e).__name__


def _run_failed(e: RuntimeError) -> str:
    return f"run failed: {_first_line(e)}"


# ------------------------------------------------------------------ the differential oracle


def _unshared_load(session: "Session") -> "Session":
    """The same program on the same devices and runtime under ``no-sharing``: each method on its own bytes."""
    from toolkit.core.policies import get_policy
    from toolkit.engine.loader import ProgramLoad

    return ProgramLoad(
        session.program,
        get_policy(UNSHARED_POLICY),
        session.devices,
        record=False,
        runtime=session.runtime,
        options=session.options,
    )


def _free(load: "Session") -> None:
    """Unload every method of the unshared side and give its device memory back."""
    for name in list(load.methods):
        load.unload(name)
    if any(d.type == "cuda" for d in load.devices.values()):
        torch.cuda.empty_cache()


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().cpu().contiguous().reshape(-1).view(torch.uint8)


def bitwise_equal(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    """Same dtypes, shapes and bytes (a NaN equals the same NaN)."""
    return len(a) == len(b) and all(
        x.dtype == y.dtype and x.shape == y.shape and torch.equal(_bits(x), _bits(y)) for x, y in zip(a, b)
    )


def _max_abs(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    """The largest error of :func:`_abs_error` over the pairs (the same rule for NaN and infinities)."""
    return max([0.0] + [_abs_error(x, y)[0] for x, y in zip(a, b)])


def compare_unshared(
    outputs: list[torch.Tensor], repeats: tuple[list[torch.Tensor], list[torch.Tensor]]
) -> dict[str, Any]:
    """max_abs_err, atol, rtol, ok of ``outputs`` against two runs of the unshared load on the same inputs:
    bit for bit where the two runs agree bit for bit; else within twice their spread (nondeterministic kernels)."""
    first, second = repeats
    if bitwise_equal(first, second):
        return {
            "max_abs_err": _max_abs(outputs, first),
            "atol": 0.0,
            "rtol": 0.0,
            "ok": bitwise_equal(outputs, first),
            "tolerance": "bit-exact",
        }
    spread = _max_abs(first, second)
    err = _max_abs(outputs, first)
    return {
        "max_abs_err": err,
        "atol": 2 * spread,
        "rtol": 0.0,
        "ok": err <= 2 * spread,
        "tolerance": f"within twice the spread of two unshared runs ({spread:.3g}): nondeterministic kernels",
    }


def _outputs(session: "Session", method: str, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    return [o.detach().cpu().clone() for o in session.run(method, inputs)]


def differential_row(
    session: "Session", spec: MethodSpec, input_sets: list[list[torch.Tensor]], oracle: str, inputs_how: str
) -> dict[str, Any]:
    """Run ``spec`` on each input set under the session's load and under an unshared load of it alone
    (loaded, run twice per set, freed again: the unshared side holds one method at a time), each run
    from the initial state; the verification row's fields."""
    out: dict[str, Any] = {"oracle": oracle}
    shared = []
    try:
        for inputs in input_sets:
            session.reset_state()
            shared.append(_outputs(session, spec.name, inputs))
    except (ToolkitError, RuntimeError) as e:
        return {**out, "oracle_detail": inputs_how, "reason": str(e) if isinstance(e, ToolkitError) else _run_failed(e)}
    load = _unshared_load(session)
    try:
        load.load_method(spec.name)
        if not load.methods[spec.name].runnable:
            raise ToolkitError("the unshared load cannot run it: " + "; ".join(load.methods[spec.name].problems))
        repeats, fresh = [], True  # just loaded: at its initial state (a reset may rewrite every constant)
        for inputs in input_sets:
            pair = []
            for _ in range(2):
                if not fresh:
                    load.reset_state()
                fresh = False
                pair.append(_outputs(load, spec.name, inputs))
            repeats.append(tuple(pair))
    except (ToolkitError, RuntimeError) as e:
        return {
            **out,
            "ok": pd.NA,
            "oracle_detail": inputs_how,
            "reason": f"{NO_REFERENCE}: the unshared load of {spec.name!r} failed: {_first_line(e)}",
        }
    finally:
        _free(load)
    per = [compare_unshared(o, r) for o, r in zip(shared, repeats)]
    bad = [i for i, p in enumerate(per) if not p["ok"]]
    tolerances = sorted({p["tolerance"] for p in per})
    return {
        **out,
        "ran": True,
        "max_abs_err": max(p["max_abs_err"] for p in per),
        "atol": max(p["atol"] for p in per),
        "rtol": 0.0,
        "ok": not bad,
        "reason": ""
        if not bad
        else f"output differs from the unshared load on draw {', '.join(str(i + 1) for i in bad)} of {len(per)}",
        "oracle_detail": f"{inputs_how}; compared {' / '.join(tolerances)}",
        "draws": ", ".join("ok" if p["ok"] else "differs" for p in per),
    }


def intended_state(load: "Session") -> tuple[str, list[str]]:
    """Point constants of different loaded methods that the program means to be one storage at one
    tensor (our programs: the eager storage they came from; a ``.pte``/``.pt2``: their storage key).

    Returns the state model in words and what a ``.pte``/``.pt2`` cannot say: a key several methods
    hold (one buffer of the eager program, or several stored once?) and an FQN several methods hold
    under different keys (several buffers, or one the exporter stored per method?)."""
    by_provenance = load.program.format is ProgramFormat.DIRECTORY
    first: dict[str, tuple[str, Any]] = {}
    held: dict[str, list[str]] = {}
    keys_of: dict[str, dict[str, str]] = {}  # FQN -> method -> key, for what the file cannot say
    for lm in load.methods.values():
        for c in lm.spec.constants:
            key = c.storage if by_provenance else c.storage_key
            if c.fqn and c.kind is not ConstantKind.LIFTED_CONSTANT:
                keys_of.setdefault(c.fqn, {})[lm.name] = key
            if not key:
                continue
            if key not in first:
                first[key] = (lm.name, c)
                continue
            owner, c0 = first[key]
            if owner == lm.name or (c0.dtype, c0.shape, c0.strides) != (c.dtype, c.shape, c.strides):
                continue
            load.swap_constant(lm.name, c.name, load.methods[owner].tensors[c0.name])
            held.setdefault(key, [owner]).append(lm.name)
    if by_provenance:
        return "state: one tensor per storage of the eager program (the build's provenance)", []
    blind = [f"{k} (held by {', '.join(ms)}) was one buffer of the eager program or several" for k, ms in held.items()]
    apart = sorted(f for f, by in keys_of.items() if len(by) > 1 and len(set(by.values())) > 1)
    unkeyed = sorted(f for f, by in keys_of.items() if len(by) > 1 and not any(by.values()))
    if unkeyed:  # payload generations 1 and 2 record no storage key: each method's constants are its own
        blind.append(
            f"{len(unkeyed)} FQN(s) held by several methods with no storage key ({', '.join(unkeyed[:3])}"
            f"{', ...' if len(unkeyed) > 3 else ''}) were one buffer or several"
        )
    if apart:
        blind.append(
            f"{len(apart)} FQN(s) held by several methods under different keys ({', '.join(apart[:3])}"
            f"{', ...' if len(apart) > 3 else ''}) were several buffers or one"
        )
    return (
        "state: one storage per storage key"
        + (
            "; the file cannot tell whether " + "; whether ".join(blind) + ": the oracle cannot see state shared "
            "wrongly under one key, or kept apart wrongly under several"
            if blind
            else ""
        )
    ), blind


def _unshared_sequence(
    session: "Session", steps: list[tuple[str, list[torch.Tensor], list[torch.Tensor]]]
) -> tuple[list[tuple[list[torch.Tensor], list[torch.Tensor]]], str, str]:
    """Each step's outputs, twice, of the sequence run on an unshared load of its methods holding the
    program's intended shared state (:func:`intended_state`); the state model; and why it stopped
    early ("" when every step ran)."""
    load = _unshared_load(session)
    try:
        for m in dict.fromkeys(m for m, _, _ in steps):
            load.load_method(m)
        model, _ = intended_state(load)
        runs: list[list[list[torch.Tensor]]] = [[], []]
        stopped = ""
        for run in runs:
            load.reset_state()
            for i, (m, inputs, _) in enumerate(steps):
                try:
                    run.append(_outputs(load, m, inputs))
                except (ToolkitError, RuntimeError) as e:
                    stopped = f"the unshared load could not run step {i} ({m}): {_first_line(e)}"
                    break
    except ToolkitError as e:
        return [], "", f"the unshared load failed: {e}"
    finally:
        _free(load)
    return list(zip(*runs)), model, stopped


def read_sequence_reference(
    program: Program, name: str, *, check_integrity: bool = True
) -> list[tuple[str, list[torch.Tensor], list[torch.Tensor]]]:
    """[(method, inputs, outputs)] of every step of a sequence, as the eager program ran it."""
    seq = program.sequence(name)
    data, path = _read_checked(program, seq.reference_file, check_integrity)
    try:
        return [
            (
                st.method,
                [data[f"step.{i}.input.{j}"] for j in range(st.num_inputs)],
                [data[f"step.{i}.output.{j}"] for j in range(st.num_outputs)],
            )
            for i, st in enumerate(seq.steps)
        ]
    except KeyError as e:
        raise ProgramError(f"sequence reference tensor {e.args[0]!r} is missing", path=path) from None


def verify_sequence(session: "Session", name: str, *, oracle: str = "auto") -> pd.DataFrame:
    """One row per step of sequence ``name``: run in order from the initial state, state carried.

    Checked against the eager sequence the program stores, or (``oracle="unshared"``) against the
    same steps run on an unshared load holding the program's intended shared state."""
    oracle = parse(Oracle, oracle, what="oracle")
    rows = []
    try:
        steps = read_sequence_reference(session.program, name, check_integrity=session.check_integrity)
    except ToolkitError as e:
        return pd.DataFrame([_empty_row(sequence=name, step=0, method="", reason=str(e))], columns=SEQUENCE_COLUMNS)
    unshared = oracle in ("unshared", "generated")  # a sequence's inputs are always its reference's
    detail, stopped, repeats = "", "", []
    if unshared:
        repeats, detail, stopped = _unshared_sequence(session, steps)
        detail = f"inputs: the program's sequence reference; {detail}"
    session.reset_state()
    broken = ""  # once a step cannot run, the state of every later step is unknown
    for i, (method, inputs, expected) in enumerate(steps):
        row = _empty_row(
            sequence=name,
            step=i,
            method=method,
            reason=broken,
            oracle=CheckedAgainst.UNSHARED_REFERENCE_INPUTS if unshared else CheckedAgainst.EAGER,
            oracle_detail=detail,
        )
        if not broken:
            try:
                outputs = [o.detach().cpu() for o in session.run(method, inputs)]
                if not unshared:
                    row["ran"] = True
                    row.update(compare_outputs(outputs, expected, against="the eager sequence"))
                elif i < len(repeats):
                    row["ran"] = True
                    result = compare_unshared(outputs, repeats[i])
                    row.update({k: v for k, v in result.items() if k != "tolerance"})
                    row["reason"] = "" if row["ok"] else "output differs from the unshared load"
                else:
                    row["ok"] = pd.NA
                    row["reason"] = f"{NO_REFERENCE}: {stopped}"
            except ToolkitError as e:
                row["reason"] = str(e)
                broken = f"not run: step {i} ({method}) could not run"
            except RuntimeError as e:
                row["reason"] = _run_failed(e)
                broken = f"not run: step {i} ({method}) failed"
        rows.append(row)
    frame = pd.DataFrame(rows, columns=SEQUENCE_COLUMNS)
    frame["ok"] = frame["ok"].astype("boolean")
    return frame


REPEATABILITY_COLUMNS = ["method", "runs", "changes_with_reset", "changes_without_reset", "cause", "buffers"]


def repeatability(session: "Session", runs: int = 3) -> pd.DataFrame:
    """Run each loaded, runnable method ``runs`` times on its reference inputs, once with the
    state reset before every run and once without, and say which outputs change and why.

    Changes that vanish with resets are state carried in mutated buffers (named: the buffers
    the method runs on that some method writes); changes that remain with identical state
    and inputs are nondeterministic kernels.  Outputs are compared bit for bit.
    """
    if runs < 2:
        raise ValueError(f"runs must be at least 2, got {runs!r}")
    state_fqns = {b.fqn for b in session.program.state_buffers()}
    rows = []
    for spec in session.program.methods:
        lm = session.methods.get(spec.name)
        if lm is None or not lm.runnable or not spec.reference_file:  # no reference: no inputs to run on
            continue
        inputs, _ = read_reference(session.program, spec, check_integrity=session.check_integrity)
        with_reset = []
        for _ in range(runs):
            session.reset_state()
            with_reset.append(_outputs(session, spec.name, inputs))
        session.reset_state()
        without = [_outputs(session, spec.name, inputs) for _ in range(runs)]
        changes_reset = any(not bitwise_equal(with_reset[0], o) for o in with_reset[1:])
        changes_free = any(not bitwise_equal(without[0], o) for o in without[1:])
        buffers = sorted(c.fqn for c in spec.constants if c.fqn in state_fqns)
        if changes_reset:
            cause = "nondeterministic kernels: outputs differ with identical state and inputs"
        elif changes_free:
            cause = "state carried in mutated buffers: " + (", ".join(buffers) or "(none known)")
        else:
            cause = ""
        rows.append(
            {
                "method": spec.name,
                "runs": runs,
                "changes_with_reset": changes_reset,
                "changes_without_reset": changes_free,
                "cause": cause,
                "buffers": ", ".join(buffers),
            }
        )
    session.reset_state()
    return pd.DataFrame(rows, columns=REPEATABILITY_COLUMNS)
