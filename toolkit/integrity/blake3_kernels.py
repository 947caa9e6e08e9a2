"""Triton kernels of BLAKE3 (imported only by :mod:`toolkit.integrity.device_digest`, on first use: this
module imports Triton).  BLAKE3's compression function as the specification gives it; a piece's
bytes are read as little-endian 32-bit words, 16 per 64-byte block."""

from __future__ import annotations

import triton
import triton.language as tl

# BLAKE3's flags, as the kernels spell them: CHUNK_START 1, CHUNK_END 2, PARENT 4, ROOT 8


@triton.jit
def _iv(BLOCK: tl.constexpr):
    """BLAKE3's eight IV words (SHA-256's), one per lane."""
    return (
        tl.full([BLOCK], 0x6A09E667, tl.uint32),
        tl.full([BLOCK], 0xBB67AE85, tl.uint32),
        tl.full([BLOCK], 0x3C6EF372, tl.uint32),
        tl.full([BLOCK], 0xA54FF53A, tl.uint32),
        tl.full([BLOCK], 0x510E527F, tl.uint32),
        tl.full([BLOCK], 0x9B05688C, tl.uint32),
        tl.full([BLOCK], 0x1F83D9AB, tl.uint32),
        tl.full([BLOCK], 0x5BE0CD19, tl.uint32),
    )


@triton.jit
def _rotr(x, n: tl.constexpr):
    return (x >> n) | (x << (32 - n))


@triton.jit
def _g(a, b, c, d, mx, my):
    a = a + b + mx
    d = _rotr(d ^ a, 16)
    c = c + d
    b = _rotr(b ^ c, 12)
    a = a + b + my
    d = _rotr(d ^ a, 8)
    c = c + d
    b = _rotr(b ^ c, 7)
    return a, b, c, d


@triton.jit
def _compress(
    h0,
    h1,
    h2,
    h3,
    h4,
    h5,
    h6,
    h7,
    m0,
    m1,
    m2,
    m3,
    m4,
    m5,
    m6,
    m7,
    m8,
    m9,
    m10,
    m11,
    m12,
    m13,
    m14,
    m15,
    t0,
    t1,
    blen,
    flags,
    BLOCK: tl.constexpr,
):
    v0, v1, v2, v3, v4, v5, v6, v7 = h0, h1, h2, h3, h4, h5, h6, h7
    v8, v9, v10, v11, _4, _5, _6, _7 = _iv(BLOCK)
    v12, v13, v14, v15 = t0, t1, blen, flags
    for _r in tl.static_range(7):
        v0, v4, v8, v12 = _g(v0, v4, v8, v12, m0, m1)
        v1, v5, v9, v13 = _g(v1, v5, v9, v13, m2, m3)
        v2, v6, v10, v14 = _g(v2, v6, v10, v14, m4, m5)
        v3, v7, v11, v15 = _g(v3, v7, v11, v15, m6, m7)
        v0, v5, v10, v15 = _g(v0, v5, v10, v15, m8, m9)
        v1, v6, v11, v12 = _g(v1, v6, v11, v12, m10, m11)
        v2, v7, v8, v13 = _g(v2, v7, v8, v13, m12, m13)
        v3, v4, v9, v14 = _g(v3, v4, v9, v14, m14, m15)
        m0, m1, m2, m3, m4, m5, m6, m7, m8, m9, m10, m11, m12, m13, m14, m15 = (
            m2,
            m6,
            m3,
            m10,
            m7,
            m0,
            m4,
            m13,
            m1,
            m11,
            m12,
            m5,
            m9,
            m14,
            m15,
            m8,
        )
    return v0 ^ v8, v1 ^ v9, v2 ^ v10, v3 ^ v11, v4 ^ v12, v5 ^ v13, v6 ^ v14, v7 ^ v15


@triton.jit
def _word(p, at, ok):
    return tl.load(p + at, mask=ok, other=0).to(tl.uint32, bitcast=True)


@triton.jit
def chunks_kernel(words, n, nchunks, out, BLOCK: tl.constexpr):
    """One lane per 1 KiB chunk: its chaining value (or, for a one-chunk input, the root)."""
    lane = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    live = lane < nchunks
    clen = tl.minimum(n - lane.to(tl.int64) * 1024, 1024).to(tl.int32)
    nblocks = tl.maximum((clen + 63) // 64, 1)
    h0, h1, h2, h3, h4, h5, h6, h7 = _iv(BLOCK)
    t0 = lane.to(tl.uint32)
    t1 = tl.zeros([BLOCK], tl.uint32)
    for b in range(16):
        ok = live & (b < nblocks)
        at = lane.to(tl.int64) * 256 + b * 16
        last = b == nblocks - 1
        blen = tl.where(last, clen - 64 * b, 64).to(tl.uint32)
        flags = (tl.where(b == 0, 1, 0) | tl.where(last, 2, 0) | tl.where(last & (nchunks == 1), 8, 0)).to(tl.uint32)
        c0, c1, c2, c3, c4, c5, c6, c7 = _compress(
            h0,
            h1,
            h2,
            h3,
            h4,
            h5,
            h6,
            h7,
            _word(words, at + 0, ok),
            _word(words, at + 1, ok),
            _word(words, at + 2, ok),
            _word(words, at + 3, ok),
            _word(words, at + 4, ok),
            _word(words, at + 5, ok),
            _word(words, at + 6, ok),
            _word(words, at + 7, ok),
            _word(words, at + 8, ok),
            _word(words, at + 9, ok),
            _word(words, at + 10, ok),
            _word(words, at + 11, ok),
            _word(words, at + 12, ok),
            _word(words, at + 13, ok),
            _word(words, at + 14, ok),
            _word(words, at + 15, ok),
            t0,
            t1,
            blen,
            flags,
            BLOCK,
        )
        h0, h1, h2, h3 = tl.where(ok, c0, h0), tl.where(ok, c1, h1), tl.where(ok, c2, h2), tl.where(ok, c3, h3)
        h4, h5, h6, h7 = tl.where(ok, c4, h4), tl.where(ok, c5, h5), tl.where(ok, c6, h6), tl.where(ok, c7, h7)
    o = out + lane.to(tl.int64) * 8
    tl.store(o + 0, h0.to(tl.int32, bitcast=True), mask=live)
    tl.store(o + 1, h1.to(tl.int32, bitcast=True), mask=live)
    tl.store(o + 2, h2.to(tl.int32, bitcast=True), mask=live)
    tl.store(o + 3, h3.to(tl.int32, bitcast=True), mask=live)
    tl.store(o + 4, h4.to(tl.int32, bitcast=True), mask=live)
    tl.store(o + 5, h5.to(tl.int32, bitcast=True), mask=live)
    tl.store(o + 6, h6.to(tl.int32, bitcast=True), mask=live)
    tl.store(o + 7, h7.to(tl.int32, bitcast=True), mask=live)


@triton.jit
def parents_kernel(cvs, nodes, out, root, BLOCK: tl.constexpr):
    """One lane per pair of nodes of a tree level: the parent's chaining value (the root's when
    ``root``); an odd level's last node is carried up unchanged."""
    lane = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    live = lane < (nodes + 1) // 2
    pair = live & (2 * lane + 1 < nodes)
    left = cvs + lane.to(tl.int64) * 16
    m0, m1, m2, m3 = _word(left, 0, live), _word(left, 1, live), _word(left, 2, live), _word(left, 3, live)
    m4, m5, m6, m7 = _word(left, 4, live), _word(left, 5, live), _word(left, 6, live), _word(left, 7, live)
    m8, m9, m10, m11 = _word(left, 8, pair), _word(left, 9, pair), _word(left, 10, pair), _word(left, 11, pair)
    m12, m13, m14, m15 = _word(left, 12, pair), _word(left, 13, pair), _word(left, 14, pair), _word(left, 15, pair)
    z = tl.zeros([BLOCK], tl.uint32)
    flags = tl.full([BLOCK], 4, tl.uint32) | tl.where(root != 0, 8, 0).to(tl.uint32)
    i0, i1, i2, i3, i4, i5, i6, i7 = _iv(BLOCK)
    c0, c1, c2, c3, c4, c5, c6, c7 = _compress(
        i0,
        i1,
        i2,
        i3,
        i4,
        i5,
        i6,
        i7,
        m0,
        m1,
        m2,
        m3,
        m4,
        m5,
        m6,
        m7,
        m8,
        m9,
        m10,
        m11,
        m12,
        m13,
        m14,
        m15,
        z,
        z,
        z + 64,
        flags,
        BLOCK,
    )
    o = out + lane.to(tl.int64) * 8
    tl.store(o + 0, tl.where(pair, c0, m0).to(tl.int32, bitcast=True), mask=live)
    tl.store(o + 1, tl.where(pair, c1, m1).to(tl.int32, bitcast=True), mask=live)
    tl.store(o + 2, tl.where(pair, c2, m2).to(tl.int32, bitcast=True), mask=live)
    tl.store(o + 3, tl.where(pair, c3, m3).to(tl.int32, bitcast=True), mask=live)
    tl.store(o + 4, tl.where(pair, c4, m4).to(tl.int32, bitcast=True), mask=live)
    tl.store(o + 5, tl.where(pair, c5, m5).to(tl.int32, bitcast=True), mask=live)
    tl.store(o + 6, tl.where(pair, c6, m6).to(tl.int32, bitcast=True), mask=live)
    tl.store(o + 7, tl.where(pair, c7, m7).to(tl.int32, bitcast=True), mask=live)
