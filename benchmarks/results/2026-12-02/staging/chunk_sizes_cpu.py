import time, statistics, torch, sys
from toolkit import open_program
from toolkit.upload import stage_pieces
prog = open_program(sys.argv[1])
m = prog.methods[0]
path, rec = prog.path(m.blob_file), prog.files[m.blob_file]
specs = [c for c in m.constants if c.nbytes]
nb = sum(c.nbytes for c in specs)
res = {}
for rep in range(3):
    for ch in ([4, 8, 16] if rep % 2 == 0 else [16, 8, 4]):
        t = time.perf_counter()
        outs = stage_pieces(path, rec, specs, torch.device("cpu"), threads=2, chunk_bytes=ch << 20)
        res.setdefault(ch, []).append(time.perf_counter() - t)
        del outs
for ch, v in sorted(res.items()):
    print(f"chunk {ch} MiB: median {statistics.median(v):.3f}s {nb/statistics.median(v)/1e9:.2f} GB/s runs {[round(x,3) for x in v]}")
