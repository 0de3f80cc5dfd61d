"""The sparse mechanisms and parameters small enough for tests, shared by the sparse tests."""

from __future__ import annotations

SPARSE = ("local", "atrous", "sparse", "strided", "fixed", "bigbird", "longnet")

#: Parameters small enough that every part of each pattern shows at lengths 7..257.
SMALL = {
    "local": {"window": 3},
    "atrous": {"r": 3},
    "sparse": {"window": 2, "r": 5},
    "strided": {"s": 4},
    "fixed": {"s": 8, "c": 2},
    "bigbird": {"block": 4, "random_blocks": 2, "seed": 3},
    "longnet": {"segments": "8:1,16:2,32:4"},
}

#: The same structures at n = 1000 (segments and blocks that do not divide 1000).
AT_1000 = {
    "local": {"window": 20},
    "atrous": {"r": 7},
    "sparse": {"window": 10, "r": 30},
    "strided": {"s": 32},
    "fixed": {"s": 48, "c": 5},
    "bigbird": {"block": 24, "random_blocks": 2, "seed": 1},
    "longnet": {"segments": "64:1,96:2,4096:16"},
}
