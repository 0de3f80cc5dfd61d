"""What every speed figure shares: the series in a results CSV, their colours, line styles and
status markers, and the text that names a setting (direction, causal flag, machine, shape)."""

from __future__ import annotations

from dataclasses import dataclass

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from attnbench import registry  # noqa: E402

#: The common reference of every panel and of the headline: dense SDPA.
REFERENCE = ("softmax", "efficient")
REFERENCE_COLOR = "0.55"
KIND_STYLE = {"reference": "--", "efficient": "-", "fused": ":"}
KIND_ORDER = {"reference": 0, "efficient": 1, "fused": 2}
KIND_LABEL = {
    "efficient": "efficient path",
    "reference": "reference path (dense oracle)",
    "fused": "fused path",
}
#: Where a series stops, the marker says why.
STATUS_MARKER = {"oom": "X", "error": "*", "skipped": ">", "unsupported": "|"}
STATUS_LABEL = {
    "oom": "out of memory",
    "error": "error",
    "skipped": "skipped (time limit)",
    "unsupported": "unsupported",
}
#: Paths of one mechanism and kind (linear: chunkwise and recurrent) differ by marker.
VARIANT_MARKERS = ("o", "s", "^", "D", "v", "P")
ITEMSIZE = {"float32": 4, "float64": 8, "bfloat16": 2, "float16": 2}
#: Colours for the mechanisms of one family (tab10 without its grey, kept for the reference).
PALETTE = tuple(plt.get_cmap("tab10")(i) for i in (0, 1, 2, 3, 4, 5, 6, 8, 9))
KEY_COLUMNS = ("direction", "causal", "device", "dtype", "head_dim")


@dataclass(frozen=True)
class Series:
    """One mechanism's path with fixed parameters, within one figure's setting."""

    family: str
    mechanism: str
    path: str
    params: str
    kind: str
    rows: pd.DataFrame  # sorted by seq_len

    @property
    def impl(self) -> str:
        return f"{self.mechanism}:{self.path}"

    @property
    def is_reference(self) -> bool:
        return (self.mechanism, self.path) == REFERENCE

    @property
    def ran(self) -> bool:
        return bool((self.rows["status"] == "ok").any())


def fmt_n(n: float) -> str:
    """1024 -> '1k', 16384 -> '16k', 96 -> '96'."""
    n = int(n)
    return f"{n // 1024}k" if n >= 1024 and n % 1024 == 0 else str(n)


def fmt_ratio(x: float) -> str:
    """A ratio as a bar label: 12×, 3.4×, 1.0×, 0.52×, 0.031×."""
    if x >= 9.95:
        return f"{x:.0f}×"
    if x >= 0.995:
        return f"{x:.1f}×"
    if x >= 0.1:
        return f"{x:.2f}×"
    return f"{x:.2g}×"


def mechanism_order() -> list[str]:
    return registry.names()


def family_order(df: pd.DataFrame) -> list[str]:
    """Families in the order of their first registered mechanism, then any others as they come."""
    known = {m.name: m.family for m in registry.MECHANISMS}
    order = list(dict.fromkeys(known.values()))
    present = list(dict.fromkeys(df["family"]))
    return [f for f in order if f in present] + [f for f in present if f not in order]


def series_in(df: pd.DataFrame) -> list[Series]:
    """Every series of ``df`` (one setting), in registry order, paths by kind."""
    known = mechanism_order()
    cols = ["family", "mechanism", "path", "params", "path_kind"]
    keys = list(dict.fromkeys(df[cols].itertuples(index=False, name=None)))

    def rank(key: tuple) -> tuple:
        mech = key[1]
        place = known.index(mech) if mech in known else len(known)
        return (place, mech, KIND_ORDER.get(key[4], 3), key[2], key[3])

    out = []
    for family, mech, path, params, kind in sorted(keys, key=rank):
        rows = df[(df["mechanism"] == mech) & (df["path"] == path) & (df["params"] == params)]
        out.append(Series(family, mech, path, params, kind, rows.sort_values("seq_len")))
    return out


def mechanism_colors(df: pd.DataFrame) -> dict[str, tuple]:
    """A colour per mechanism, distinct within its family (the panels are per family), the same
    in every figure made from one CSV."""
    colors: dict[str, tuple] = {}
    known = mechanism_order()
    for family in family_order(df):
        mechs = list(dict.fromkeys(df[df["family"] == family]["mechanism"]))
        mechs.sort(key=lambda m: known.index(m) if m in known else len(known))
        mechs = [m for m in mechs if m != REFERENCE[0]] + [REFERENCE[0]] * (REFERENCE[0] in mechs)
        for i, mech in enumerate(mechs):
            colors[mech] = PALETTE[i % len(PALETTE)]
    return colors


def variant_markers(series: list[Series]) -> dict[tuple, str]:
    """Series key -> marker: the first path of a mechanism and kind gets 'o', the next 's', ..."""
    seen: dict[tuple[str, str], int] = {}
    out = {}
    for s in series:
        index = seen.get((s.mechanism, s.kind), 0)
        seen[(s.mechanism, s.kind)] = index + 1
        out[(s.mechanism, s.path, s.params)] = VARIANT_MARKERS[index % len(VARIANT_MARKERS)]
    return out


def figure_keys(df: pd.DataFrame) -> list[tuple]:
    """(direction, causal, device, dtype, head_dim) of every setting in the file."""
    return list(df[list(KEY_COLUMNS)].drop_duplicates().itertuples(index=False, name=None))


def select(df: pd.DataFrame, key: tuple) -> pd.DataFrame:
    mask = pd.Series(True, index=df.index)
    for col, value in zip(KEY_COLUMNS, key, strict=True):
        mask &= df[col] == value
    return df[mask]


def file_stem(df: pd.DataFrame, key: tuple) -> str:
    """``fwd-bidir``, plus device, dtype and head dim when the file mixes them."""
    direction, causal, device, dtype, head_dim = key
    stem = f"{direction}-{'causal' if causal else 'bidir'}"
    for col, value, text in (
        ("device", device, str(device)),
        ("dtype", dtype, str(dtype)),
        ("head_dim", head_dim, f"d{head_dim}"),
    ):
        if df[col].nunique() > 1 and value is not None:
            stem += f"-{text}"
    return stem


def direction_text(direction: str) -> str:
    return "forward" if direction == "fwd" else "forward + backward"


def memory_column(direction: str) -> str:
    return "mem_fwd_bytes" if direction == "fwd" else "mem_fwdbwd_bytes"


def batch_text(df: pd.DataFrame) -> str:
    batches = sorted(df["batch"].dropna().unique())
    if len(batches) == 1:
        return str(batches[0])
    return f"{batches[-1]}..{batches[0]} (fixed tokens)"


def setting_text(df: pd.DataFrame) -> str:
    """``cpu (AMD EPYC), float32, B=1 H=4 D=64, 2 threads, suite long``."""
    first = df.iloc[0]
    return (
        f"{first['device']} ({first['device_name']}), {first['dtype']}, "
        f"B={batch_text(df)} H={first['heads']} D={first['head_dim']}, "
        f"{threads_text(first['threads'])}, suite {first['suite']}"
    )


def threads_text(threads) -> str:
    return f"{threads} thread" + ("" if threads == 1 else "s")
