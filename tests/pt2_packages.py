"""Small torch ``.pt2`` packages for the tests, compiled on CPU once and cached on disk.

Three models in one archive, packaged with ``torch._inductor.package.package_aoti``, once per
on-disk constants format (``binary_blob``, ``pickle_weights``):

* ``prefill``: ``lin(x) @ table + buf`` (``lin`` a shared ``Linear(16, 16)``, ``buf`` a shared
  buffer, ``table`` a plain tensor attribute: lifted as ``_tensor_constant0``);
* ``decode``: ``relu(lin(x) @ table2 + buf)``: another graph, its own ``_tensor_constant0``;
* ``prefill_again``: prefill's graph with a third table: AOTInductor compiles the same
  ``.so`` (byte-identical), so ExecuTorch 1.5.x would give both lifted tables one storage key.

For CUDA (:func:`cuda_packages`, on a GPU machine) the archives hold two models, ``prefill``
and ``decode``, compiled for ``cuda``.

:func:`adapter_packages`: two models whose adapters share FQNs with other data, on integer
token ids (both formats): ``chat`` (``adapter(embed(tokens))``, ``tokens`` of a dynamic length
in [3, 64], exported at length 8) and ``code`` (its own adapter under the same FQNs, static
tokens and a float scale); ``embed`` is one shared ``Embedding``.

The cache key covers this file's source, the device and torch's version; the cache lives under
the one build cache's ``programs/`` (:func:`toolkit.build.samples.cache_root`).
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import os
import shutil
import tempfile
from pathlib import Path

FORMATS = ("binary_blob", "pickle_weights")
MODELS = ("prefill", "decode", "prefill_again")
CUDA_MODELS = ("prefill", "decode")
ADAPTER_MODELS = ("chat", "code")
CHAT_MIN_LENGTH = 3  # the smallest token count chat's dynamic dimension allows


def _modules(device: str = "cpu"):
    import torch

    g = torch.Generator().manual_seed(0)
    lin = torch.nn.Linear(16, 16)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(16, 16, generator=g))
        lin.bias.copy_(torch.randn(16, generator=g))
    buf = torch.randn(16, generator=g)

    class Step(torch.nn.Module):
        def __init__(self, table, relu: bool):
            super().__init__()
            self.lin = lin
            self.register_buffer("buf", buf)
            self.table = table  # neither a parameter nor a buffer: lifted as a tensor constant
            self.relu = relu

        def forward(self, x):
            y = self.lin(x) @ self.table + self.buf
            return torch.relu(y) if self.relu else y

    x = torch.randn(2, 16, generator=g)
    out = {
        "prefill": (Step(torch.randn(16, 16, generator=g), False), (x,)),
        "decode": (Step(torch.randn(16, 16, generator=g), True), (x,)),
        "prefill_again": (Step(torch.randn(16, 16, generator=g) * 3, False), (x,)),
    }
    if device == "cpu":
        return out
    moved = {}
    for n, (m, args) in out.items():
        if n in CUDA_MODELS:
            m = m.to(device)
            m.table = m.table.to(device)  # a plain tensor attribute: Module.to leaves it behind
            moved[n] = (m, tuple(a.to(device) for a in args))
    return moved


def modules(device: str = "cpu"):
    """model -> (module, example args) the package was compiled from: ``verify(references=...)``."""
    return _modules(device)


def eager_tensors() -> dict[str, dict[str, "object"]]:
    """model -> FQN -> the eager tensor each constant was compiled from."""
    out = {}
    for name, (m, _) in _modules().items():
        out[name] = {
            "lin.weight": m.lin.weight.detach(),
            "lin.bias": m.lin.bias.detach(),
            "buf": m.buf,
            "_tensor_constant0": m.table,
        }
    return out


def _build(out: Path, device: str = "cpu") -> None:
    import torch
    from torch._inductor.package import package_aoti

    compiler = "/usr/bin/g++"
    if Path(compiler).exists():
        torch._inductor.config.cpp.cxx = (None, compiler)
    tmp = Path(tempfile.mkdtemp(prefix="pt2-build-", dir=out.parent))
    try:
        for fmt in FORMATS:
            files = {}
            for name, (module, args) in _modules(device).items():
                ep = torch.export.export(module, args)
                got = torch._inductor.aot_compile(
                    ep.module(),
                    args,
                    options={
                        "aot_inductor.package": True,
                        "aot_inductor.package_constants_in_so": False,
                        "aot_inductor.package_constants_on_disk_format": fmt,
                    },
                )
                # copy at once: graphs that differ only in constants share the compile cache's paths
                keep = tmp / fmt / name
                keep.mkdir(parents=True)
                # (as str: torch 2.11's package_aoti calls str methods on every file name)
                files[name] = [
                    str(shutil.copy(f, keep / os.path.basename(f))) if isinstance(f, str) else f for f in got
                ]
            package_aoti(str(out / f"{fmt}.pt2"), files)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@functools.lru_cache(maxsize=None)
def packages(device: str = "cpu") -> dict[str, Path]:
    """format -> the .pt2 package (built on first use, then read from the cache)."""
    import torch

    h = hashlib.sha256(
        inspect.getsource(_modules).encode()
        + inspect.getsource(_build).encode()
        + torch.__version__.encode()
        + device.encode()
    ).hexdigest()[:12]
    from toolkit.build.samples import cache_root

    return _built_once(
        cache_root(),
        f"pt2-packages-{'' if device == 'cpu' else device + '-'}{h}",
        f".pt2-packages-{h}",
        lambda part: _build(part, device),
    )


def _built_once(root: Path, name: str, partial: str, build) -> dict[str, Path]:
    """format -> its package under ``root / name``; when one is missing, ``build(folder)`` makes them all in a
    partial folder of this process, which replaces ``name`` whole (never a half-built set)."""
    out = root / name
    paths = {fmt: out / f"{fmt}.pt2" for fmt in FORMATS}
    if not all(p.is_file() for p in paths.values()):
        part = root / f"{partial}.partial-{os.getpid()}"
        shutil.rmtree(part, ignore_errors=True)
        part.mkdir(parents=True)
        build(part)
        shutil.rmtree(out, ignore_errors=True)
        part.rename(out)
    return paths


def _adapter_modules():
    import torch

    g = torch.Generator().manual_seed(1)
    embed = torch.nn.Embedding(32, 16)
    with torch.no_grad():
        embed.weight.copy_(torch.randn(32, 16, generator=g))

    def adapter():
        lin = torch.nn.Linear(16, 16)
        with torch.no_grad():
            lin.weight.copy_(torch.randn(16, 16, generator=g))
            lin.bias.copy_(torch.randn(16, generator=g))
        return lin

    class Chat(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed, self.adapter = embed, adapter()

        def forward(self, tokens):
            return self.adapter(self.embed(tokens))

    class Code(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed, self.adapter = embed, adapter()

        def forward(self, tokens, scale):
            return torch.tanh(self.adapter(self.embed(tokens))) * scale

    length = torch.export.Dim("length", min=CHAT_MIN_LENGTH, max=64)
    return {
        "chat": (Chat(), (torch.randint(0, 32, (8,), generator=g),), {"tokens": {0: length}}),
        "code": (Code(), (torch.randint(0, 32, (4,), generator=g), torch.randn(4, 1, generator=g)), None),
    }


def adapter_modules():
    """model -> (module, example args) of :func:`adapter_packages` (chat's args at its export length)."""
    return {n: (m, args) for n, (m, args, _) in _adapter_modules().items()}


def _package(path: Path, models: dict, tmp: Path, fmt: str) -> None:
    """Compile each (module, args, dynamic shapes) with AOTInductor on CPU and package them at ``path``."""
    import torch
    from torch._inductor.package import package_aoti

    files = {}
    for name, (module, args, dynamic) in models.items():
        ep = torch.export.export(module, args, dynamic_shapes=dynamic)
        got = torch._inductor.aot_compile(
            ep.module(),
            args,
            options={
                "aot_inductor.package": True,
                "aot_inductor.package_constants_in_so": False,
                "aot_inductor.package_constants_on_disk_format": fmt,
            },
        )
        keep = tmp / fmt / name  # copied at once: the compile cache's paths are shared between graphs
        keep.mkdir(parents=True)
        files[name] = [str(shutil.copy(f, keep / os.path.basename(f))) if isinstance(f, str) else f for f in got]
    package_aoti(str(path), files)


@functools.lru_cache(maxsize=None)
def adapter_packages() -> dict[str, Path]:
    """format -> the two-model (chat, code) CPU .pt2 (built on first use, then read from the cache)."""
    import torch

    h = hashlib.sha256(
        inspect.getsource(_adapter_modules).encode() + inspect.getsource(_package).encode() + torch.__version__.encode()
    ).hexdigest()[:12]
    from toolkit.build.samples import cache_root

    def build(part: Path) -> None:
        compiler = "/usr/bin/g++"
        if Path(compiler).exists():
            torch._inductor.config.cpp.cxx = (None, compiler)
        try:
            for fmt in FORMATS:
                _package(part / f"{fmt}.pt2", _adapter_modules(), part / "build", fmt)
        finally:
            shutil.rmtree(part / "build", ignore_errors=True)

    return _built_once(cache_root(), f"pt2-adapters-{h}", f".pt2-adapters-{h}", build)


def cuda_packages() -> dict[str, Path]:
    """format -> a two-model (prefill, decode) .pt2 compiled for CUDA (needs a GPU)."""
    return packages("cuda")
