"""One speed run read as a table of paths against the machine and their peers, at one length
(``attnbench compare RESULTS --peer PATH=PEER --n N``).

Per path (``MECHANISM:PATH``) and direction (forward; forward + backward):

* the fraction of the float32 matmul rate measured in the same rounds (the run's ``roofline``
  column: the mechanism's FLOPs over the path's time, over the matmul anchor's FLOP/s);
* the speed-up over the suite's reference, dense SDPA, in the same rounds (1 / ``ref_ratio``);
* for each peer: the peer's time over the path's (the same case, the same run; above 1 the path
  is faster), and the peer's own fraction of the matmul rate. A peer written ``:NAME`` is the
  path ``NAME`` of the same mechanism. A case the peer did not run (forward only, skipped,
  failed) reads "-" with its status.

Only the rows of one causality (bidirectional unless asked) at one length are read.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from attnbench.core.errors import AttnbenchError

DIRECTIONS = (("fwd", "fwd"), ("fwdbwd", "fwd+bwd"))


@dataclass(frozen=True)
class Peer:
    """``path`` read against ``peer`` (``MECHANISM:PATH``; None: the path's row alone), in the
    column ``label``."""

    path: str
    peer: str | None = None
    label: str = ""


def parse_peer(text: str) -> Peer:
    """``PATH=PEER`` (``PEER`` may be ``:NAME``, the same mechanism's path ``NAME``, one column
    for every mechanism's) or ``PATH`` alone."""
    path, sep, peer = text.partition("=")
    if ":" not in path or (sep and not peer):
        raise AttnbenchError(
            f"--peer {text!r}: accepted: PATH=PEER or PATH, each MECHANISM:PATH (e.g. "
            "local:efficient=:flex)"
        )
    if not sep:
        return Peer(path)
    if peer.startswith(":"):
        return Peer(path, path.split(":", 1)[0] + peer, peer[1:])
    return Peer(path, peer, peer)


def _read(results: Path, n: int, causal: bool) -> pd.DataFrame:
    if not results.is_file():
        raise AttnbenchError(f"{results}: not a file; accepted: a speed run's results.csv")
    df = pd.read_csv(results)
    df = df[(df["seq_len"] == n) & (df["causal"].astype(str).str.lower() == str(causal).lower())]
    df = df.assign(impl=df["mechanism"] + ":" + df["path"])
    return df.set_index(["impl", "direction"])


def _against(record: dict[str, Any], df: pd.DataFrame, key: tuple[str, str], peer: Peer) -> None:
    """The peer's columns of one row: its time over the path's and its own matmul rate."""
    row = df.loc[key]
    theirs = (peer.peer, key[1])
    other = df.loc[theirs] if theirs in df.index else None
    if other is not None and other["status"] == "ok" and row["status"] == "ok":
        record[f"vs {peer.label}"] = float(other["time_median_ms"]) / float(row["time_median_ms"])
        record[f"{peer.label} matmul_fraction"] = float(other["roofline"])
    else:
        record[f"vs {peer.label}"] = "not in the run" if other is None else str(other["status"])


def peer_rows(results: Path, n: int, peers: Sequence[Peer], causal: bool = False) -> list[dict]:
    """One record per path and direction of ``results`` at length ``n``."""
    df = _read(results, n, causal)
    out = []
    for impl in dict.fromkeys(p.path for p in peers):
        for direction, label in DIRECTIONS:
            if (impl, direction) not in df.index:
                continue
            row = df.loc[(impl, direction)]
            ok = row["status"] == "ok"
            record: dict[str, Any] = {
                "path": impl,
                "direction": label,
                "status": row["status"],
                "matmul_fraction": float(row["roofline"]) if ok else float("nan"),
                "vs_sdpa": 1.0 / float(row["ref_ratio"]) if ok else float("nan"),
            }
            for peer in peers:
                if peer.path == impl and peer.peer is not None:
                    _against(record, df, (impl, direction), peer)
            out.append(record)
    if not out:
        names = ", ".join(dict.fromkeys(p.path for p in peers))
        raise AttnbenchError(f"--n {n}: none of {names} has a row at this length in {results}")
    return out


def peer_markdown(records: Sequence[dict], peers: Sequence[Peer]) -> str:
    """The records as a Markdown table: a rate column, the reference and two columns a peer."""
    labels = list(dict.fromkeys(p.label for p in peers if p.peer is not None))

    def pct(x: object) -> str:
        return "-" if not isinstance(x, float) or x != x else f"{100 * x:.1f} %"

    def times(x: object) -> str:
        if isinstance(x, str):
            return f"- ({x})"
        return "" if x is None or x != x else f"{x:.2f}x"

    head = ["path", "direction", "matmul rate", "vs dense SDPA"]
    for label in labels:
        head += [f"vs `{label}`", f"`{label}`: matmul rate"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * 2 + "---:|" * (len(head) - 2)]
    for r in records:
        cells = [f"`{r['path']}`", r["direction"], pct(r["matmul_fraction"]), times(r["vs_sdpa"])]
        for label in labels:
            cells += [times(r.get(f"vs {label}")), pct(r.get(f"{label} matmul_fraction"))]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
