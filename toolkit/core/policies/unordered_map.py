"""The iteration order of libstdc++'s ``std::unordered_map<std::string, T>``, computed in Python.

ExecuTorch's validation loop walks its FQN map in this order, so which mismatching constant it
meets first (and which misses it has cached by then) depends on it.
"""

from __future__ import annotations

from typing import Iterable

_M64 = (1 << 64) - 1
_HASH_MUL = 0xC6A4A7935BD1E995
# The bucket counts a libstdc++ unordered_map grows through as keys are inserted one at a time (its
# _Prime_rehash_policy: 13 at the first insert, then its listed prime >= twice the count), read from g++ 12.
_LIBSTDCXX_BUCKETS = (
    13,
    29,
    59,
    127,
    257,
    541,
    1109,
    2357,
    5087,
    10273,
    20753,
    42043,
    85229,
    172933,
    351061,
    712697,
    1447153,
    2938679,
    5967347,
    12117689,
    24607243,
)


def libstdcxx_string_hash(key: str) -> int:
    """``std::hash<std::string>`` of 64-bit libstdc++: ``_Hash_bytes`` (MurmurHash64A-like), seed 0xc70f6907."""
    data, mix = key.encode(), (lambda v: v ^ (v >> 47))
    n, whole = len(data), len(data) & ~7
    h = (0xC70F6907 ^ (n * _HASH_MUL)) & _M64
    for i in range(0, whole, 8):
        h = (
            (h ^ (mix(int.from_bytes(data[i : i + 8], "little") * _HASH_MUL & _M64) * _HASH_MUL & _M64)) * _HASH_MUL
        ) & _M64
    if n & 7:
        h = ((h ^ int.from_bytes(data[whole:], "little")) * _HASH_MUL) & _M64
    return mix(mix(h) * _HASH_MUL & _M64)


def unordered_map_order(keys: Iterable[str]) -> list[str]:
    """The iteration order of a libstdc++ ``std::unordered_map<std::string, T>`` after ``map[key] = ...`` for
    each key in turn (a key met again is not re-inserted).  A node goes to the front of its bucket, a node
    of an empty bucket to the front of the list; a rehash re-links the nodes in list order by the same rule.
    The C++ standard leaves this order to the implementation: this is GCC's (Linux builds); libc++ and MSVC
    iterate otherwise."""
    hashes: dict[str, int] = {}
    buckets: dict[int, list[str]] = {}  # each bucket's keys, front last
    fronts: list[int] = []  # the buckets, front last
    level = -1
    for key in keys:
        if key in hashes:
            continue
        if level < 0 or len(hashes) + 1 > _LIBSTDCXX_BUCKETS[level]:
            level += 1
            now = [k for b in reversed(fronts) for k in reversed(buckets[b])]
            buckets, fronts = {}, []
            for k in now:
                _link(k, hashes[k] % _LIBSTDCXX_BUCKETS[level], buckets, fronts)
        hashes[key] = libstdcxx_string_hash(key)
        _link(key, hashes[key] % _LIBSTDCXX_BUCKETS[level], buckets, fronts)
    return [k for b in reversed(fronts) for k in reversed(buckets[b])]


def _link(key: str, bucket: int, buckets: dict[int, list[str]], fronts: list[int]) -> None:
    if bucket in buckets:
        buckets[bucket].append(key)
    else:
        buckets[bucket] = [key]
        fronts.append(bucket)
