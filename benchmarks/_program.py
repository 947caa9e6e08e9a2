"""The large prefill/decode program the GPU benchmarks load.

A trivial graph over a few big weights, so AOTInductor compiles quickly while each method
holds >= 2 GiB of constants (at the default hidden size 8192, float32: 256 MiB per weight):

* ``layers.0..6.weight`` (hidden x hidden): the same tensors in both methods, genuinely shared;
* ``head.weight`` (hidden x hidden): same FQN, metadata and shape, other data in ``decode``
  (an independent sub-module: ExecuTorch's metadata check passes, the data differs);
* ``adapter.weight``: same FQN, other shape (hidden x 512 vs hidden x 256): a metadata
  mismatch ExecuTorch declines (or refuses, before #21959);
* ``decode_bias``: only in ``decode``, so ``decode`` has a cache miss and ExecuTorch
  policies upload its whole blob;
* ``kv`` (8 x hidden): a buffer ``prefill`` writes and ``decode`` reads (optional).
"""

from __future__ import annotations

import os

import torch

LAYERS = 7
UPLOAD_ENV = "CONSTSHARE_UPLOAD"  # read by toolkit.core.options.options_from_environment (by older toolkits themselves)
BATCH = {"prefill": 8, "decode": 1}


class Mat(torch.nn.Module):
    def __init__(self, rows: int, cols: int, gen: torch.Generator, device):
        super().__init__()
        w = torch.randn(rows, cols, generator=gen, device=device) * rows**-0.5
        self.weight = torch.nn.Parameter(w, requires_grad=False)

    def forward(self, x):
        return x @ self.weight


class _Base(torch.nn.Module):
    def __init__(self, layers: torch.nn.ModuleList, head: Mat, adapter: Mat, hidden: int, with_kv: bool, device):
        super().__init__()
        self.layers = layers
        self.head = head
        self.adapter = adapter
        self.with_kv = with_kv
        if with_kv:
            self.register_buffer("kv", torch.zeros(BATCH["prefill"], hidden, device=device))

    def trunk(self, x):
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return x


class Prefill(_Base):
    def forward(self, x):
        h = self.trunk(x)
        if self.with_kv:
            self.kv.copy_(h)  # prefill writes the cache
        return self.adapter(torch.tanh(self.head(h)))


class Decode(_Base):
    def __init__(self, *args, hidden: int, device, **kw):
        super().__init__(*args, hidden=hidden, device=device, **kw)
        g = torch.Generator(device=device).manual_seed(300)
        self.register_buffer("decode_bias", torch.randn(hidden, generator=g, device=device) * 0.1)

    def forward(self, x):
        h = self.trunk(x) + self.decode_bias
        if self.with_kv:
            h = h + self.kv.sum(0)  # decode reads it
        return self.adapter(torch.tanh(self.head(h)))


def methods(device: str = "cuda", hidden: int = 8192, with_kv: bool = True) -> dict:
    dev = torch.device(device)
    g = torch.Generator(device=dev).manual_seed(0)
    layers = torch.nn.ModuleList([Mat(hidden, hidden, g, dev) for _ in range(LAYERS)])
    common = dict(hidden=hidden, with_kv=with_kv, device=dev)
    prefill = Prefill(layers, Mat(hidden, hidden, g, dev), Mat(hidden, 512, g, dev), **common)
    decode = Decode(layers, Mat(hidden, hidden, g, dev), Mat(hidden, 256, g, dev), **common)
    gi = torch.Generator(device=dev).manual_seed(1)
    return {
        "prefill": (prefill, (torch.randn(BATCH["prefill"], hidden, generator=gi, device=dev),)),
        "decode": (decode, (torch.randn(BATCH["decode"], hidden, generator=gi, device=dev),)),
    }


def build(out_dir, device: str = "cuda", hidden: int = 8192):
    """Build (or reuse) the program; falls back to no ``kv`` buffer if that fails to compile."""
    from pathlib import Path

    from toolkit import build_program, open_program
    from toolkit.core.errors import ToolkitError

    out = Path(out_dir)
    if (out / "manifest.json").is_file():
        try:
            return open_program(out), 0.0, "reused"
        except ToolkitError:
            pass
    import time

    t = time.perf_counter()
    try:
        prog = build_program(
            methods(device, hidden, True),
            out,
            device=device,
            name="bench_prefill_decode",
            description="benchmarks/_program.py",
            progress=False,
            overwrite=True,
        )
        note = "with kv buffer"
    except Exception as e:  # keep the benchmark alive: the kv mutation is the riskiest part
        print(f"build with the kv buffer failed ({type(e).__name__}: {str(e)[:200]}); building without it")
        prog = build_program(
            methods(device, hidden, False),
            out,
            device=device,
            name="bench_prefill_decode",
            description="benchmarks/_program.py (no kv)",
            progress=False,
            overwrite=True,
        )
        note = "without kv buffer (build with it failed)"
    return prog, time.perf_counter() - t, note


def check_upload_path(device, choice: str) -> str:
    """Upload odd-sized constants (sharing pages, unaligned) through the uploader that
    ``CONSTSHARE_UPLOAD=choice`` selects and compare the bytes.

    Returns "" when every byte arrived by that path, else what went wrong.  The GPU
    benchmarks call it first and fall back to a slower path (saying so) rather than measure
    a broken one.
    """
    import tempfile
    from pathlib import Path

    from toolkit import upload

    # default_path.py --toolkit may run this with an older toolkit that keeps ConstantSpec in
    # toolkit/manifest.py.  That module first: under an editable install, a module the older folder
    # lacks would be found in this checkout instead and mix the two versions.
    try:
        from toolkit.manifest import ConstantSpec
    except ImportError:
        from toolkit.core.model import ConstantSpec
    from toolkit.core.vocab import ConstantKind

    dev = torch.device(device)
    sizes = [0, 1, 4096 + 3, (8 << 20) + 5, (64 << 20) * 2 + 12345, 77]
    data = torch.randint(0, 256, (sum(sizes) + 64,), dtype=torch.uint8)
    old = os.environ.get(UPLOAD_ENV)
    os.environ[UPLOAD_ENV] = choice
    try:
        with tempfile.TemporaryDirectory() as d:
            blob = Path(d) / "blob"
            blob.write_bytes(data.numpy().tobytes())
            try:  # this toolkit: the options say the path (read from the CONSTSHARE_UPLOAD set above)
                from toolkit.core.options import options_from_environment

                uploader = upload.make_uploader(dev, options_from_environment())
            except ImportError:  # an older toolkit without toolkit/options.py reads the environment itself
                uploader = upload.make_uploader(dev)
            warm = getattr(upload, "PATH_MAPPED_WARM", "page-locked mapping, already locked")  # UploadPath.MAPPED_WARM
            specs, off = [], 7
            for n in sizes:
                specs.append(
                    ConstantSpec(
                        name=f"c{n}",
                        fqn=f"c{n}",
                        kind=ConstantKind.BUFFER,
                        mutated=False,
                        dtype="uint8",
                        shape=(n,),
                        strides=(1,),
                        storage_offset=0,
                        nbytes=n,
                        offset=off,
                        digest="0" * 64,
                    )
                )
                off += n
            locks = upload.HostLockCache(1 << 40)
            if isinstance(uploader, upload.MappedBlobUploader):
                uploader.locks = locks  # not the process's cache: leave nothing locked behind
            for load in ("first load", "reload"):  # the mapped path stages first, then copies locked pages
                if uploader is not None:
                    uploader.prefetch(blob, specs)
                for c in specs:
                    got = upload.upload_constant(blob, c, dev, uploader).cpu()
                    if not torch.equal(got, data[c.offset : c.offset + c.nbytes]):
                        return f"{load}: bytes differ for a {c.nbytes}-byte constant"
                    if c.nbytes and choice == "mapped" and load == "reload" and uploader.last_path != warm:
                        return f"reload fell back to {uploader.last_path}: {uploader.disabled_reason}"
                if uploader is not None:
                    uploader.release()
                    locks.wait_until_locked()
            if uploader is not None:
                uploader.close()
            locks.wait_until_locked()
            locks.clear()
    except Exception as e:
        return f"{type(e).__name__}: {e}"
    finally:
        if old is None:
            os.environ.pop(UPLOAD_ENV, None)
        else:
            os.environ[UPLOAD_ENV] = old
    return ""


def choose_upload_path(device) -> str:
    """The fastest upload path that passes :func:`check_upload_path`, set in
    ``CONSTSHARE_UPLOAD`` for this process and the child processes it starts.  Returns a note."""
    if torch.device(device).type != "cuda":
        return "cpu"
    problems = []
    for choice in ("mapped", "staged", "unstaged"):
        problem = check_upload_path(device, choice)
        if not problem:
            os.environ[UPLOAD_ENV] = choice
            return choice if not problems else f"{choice} ({'; '.join(problems)})"
        print(f"!!! upload path {choice!r} failed its check ({problem}); trying the next one")
        problems.append(f"{choice} failed: {problem}")
    raise RuntimeError("no upload path passed its check: " + "; ".join(problems))


def warm_up(device, hidden: int) -> None:
    """Load cuBLAS (handle, workspace, kernels) on ``device`` before a baseline is taken.

    The methods' matmuls go through torch's cuBLAS; without this, the first verify() of a
    process allocates ~100 MiB that stays for the life of the process and would be
    mis-counted as memory a load failed to return.
    """
    dev = torch.device(device)
    if dev.type != "cuda":
        return
    w = torch.randn(hidden, hidden, device=dev)
    for rows in (BATCH["prefill"], BATCH["decode"]):
        torch.tanh(torch.randn(rows, hidden, device=dev) @ w)
    torch.cuda.synchronize(dev)
    del w


def hidden_of(prog) -> int:
    square = [c.shape[0] for c in prog.methods[0].constants if len(c.shape) == 2 and c.shape[0] == c.shape[1]]
    return int(max(square)) if square else 8192


def prepare(device_arg: str, program_dir, hidden: int):
    """The start every single-device benchmark shares: the device (its CUDA context created
    before any baseline), the upload path in use, and the program (built or reused).

    Returns ``(device, upload_path_note, program, build_seconds, build_note)``.
    """
    import torch

    dev = torch.device(device_arg)
    if dev.type == "cuda":
        dev = torch.device("cuda", dev.index or 0)
        torch.zeros(1, device=dev)  # the CUDA context exists before any baseline
    upload_path = choose_upload_path(dev)
    prog, build_s, note = build(program_dir, dev.type, hidden)
    return dev, upload_path, prog, build_s, note
