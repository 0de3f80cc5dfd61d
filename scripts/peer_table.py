"""One speed run read as a table of paths against the machine and their peers, at one length.

    python scripts/peer_table.py results/speed/cpu-long/results.csv --n 8192 \\
        --impl local:efficient --impl linear:chunkwise \\
        --peer local:efficient=local:local-attention --peer local:efficient=:flex

Per path (``MECHANISM:PATH``) and direction (forward; forward + backward):

* the fraction of the float32 matmul rate measured in the same rounds (the run's ``roofline``
  column: the mechanism's FLOPs over the path's time, over the matmul anchor's FLOP/s);
* the speed-up over dense SDPA in the same rounds (1 / ``ref_ratio``);
* for each ``--peer PATH=PEER``: the peer's time over the path's (the same case, the same run;
  above 1 the path is faster), and the peer's own fraction of the matmul rate. ``PEER`` written
  ``:NAME`` is the path ``NAME`` of the same mechanism. A case the peer did not run (forward
  only, skipped, failed) reads "-" with its status.

Only bidirectional rows of the run's dtype are read unless ``--causal`` is given. Prints
Markdown; ``--csv FILE`` also writes the numbers.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

DIRECTIONS = (("fwd", "fwd"), ("fwdbwd", "fwd+bwd"))


def resolve_peer(path: str, peer: str) -> tuple[str, str]:
    """(the peer's MECHANISM:PATH, its column): ``:flex`` against ``local:efficient`` is
    ``local:flex`` in the column ``flex`` (one column for every mechanism's flex path)."""
    if peer.startswith(":"):
        return path.split(":", 1)[0] + peer, peer[1:]
    return peer, peer


def read(results: Path, n: int, causal: bool) -> pd.DataFrame:
    df = pd.read_csv(results)
    df = df[(df["seq_len"] == n) & (df["causal"].astype(str).str.lower() == str(causal).lower())]
    df = df.assign(impl=df["mechanism"] + ":" + df["path"])
    return df.set_index(["impl", "direction"])


def rows(df: pd.DataFrame, impls: list[str], peers: list[tuple[str, str, str]]) -> list[dict]:
    out = []
    for impl in impls:
        for direction, label in DIRECTIONS:
            if (impl, direction) not in df.index:
                continue
            row = df.loc[(impl, direction)]
            ok = row["status"] == "ok"
            record = {
                "path": impl,
                "direction": label,
                "status": row["status"],
                "matmul_fraction": float(row["roofline"]) if ok else float("nan"),
                "vs_sdpa": 1.0 / float(row["ref_ratio"]) if ok else float("nan"),
            }
            for path, peer, label in peers:
                if path != impl:
                    continue
                other = df.loc[(peer, direction)] if (peer, direction) in df.index else None
                mine = float(row["time_median_ms"]) if ok else float("nan")
                if other is not None and other["status"] == "ok" and ok:
                    record[f"vs {label}"] = float(other["time_median_ms"]) / mine
                    record[f"{label} matmul_fraction"] = float(other["roofline"])
                else:
                    status = "not in the run" if other is None else str(other["status"])
                    record[f"vs {label}"] = status
            out.append(record)
    return out


def markdown(records: list[dict], peers: list[tuple[str, str, str]]) -> str:
    peer_names = list(dict.fromkeys(label for _, _, label in peers))

    def pct(x: object) -> str:
        return "-" if not isinstance(x, float) or x != x else f"{100 * x:.1f} %"

    def times(x: object) -> str:
        if isinstance(x, str):
            return f"- ({x})"
        return "" if x is None or x != x else f"{x:.2f}x"

    head = ["path", "direction", "matmul rate", "vs dense SDPA"]
    for peer in peer_names:
        head += [f"vs `{peer}`", f"`{peer}`: matmul rate"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * 2 + "---:|" * (len(head) - 2)]
    for r in records:
        cells = [f"`{r['path']}`", r["direction"], pct(r["matmul_fraction"]), times(r["vs_sdpa"])]
        for peer in peer_names:
            cells += [times(r.get(f"vs {peer}")), pct(r.get(f"{peer} matmul_fraction"))]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", type=Path, help="a speed run's results.csv")
    ap.add_argument("--n", type=int, required=True, help="the sequence length to read")
    ap.add_argument("--impl", action="append", required=True, metavar="MECHANISM:PATH")
    ap.add_argument("--peer", action="append", default=[], metavar="PATH=PEER",
                    help="a peer read against PATH in the same run (repeatable)")  # fmt: skip
    ap.add_argument("--causal", action="store_true", help="read the causal rows instead")
    ap.add_argument("--csv", type=Path, help="also write the numbers here")
    args = ap.parse_args(argv)
    if not args.results.is_file():
        raise SystemExit(f"error: {args.results} is not a file (a speed run's results.csv)")
    peers = []
    for item in args.peer:
        path, sep, peer = item.partition("=")
        if not sep or not path or not peer:
            raise SystemExit(
                f"error: --peer {item!r}: expected PATH=PEER, e.g. local:efficient=:flex"
            )
        peers.append((path, *resolve_peer(path, peer)))
    records = rows(read(args.results, args.n, args.causal), args.impl, peers)
    if not records:
        raise SystemExit(f"error: none of {', '.join(args.impl)} has a row at n = {args.n}")
    if args.csv:
        pd.DataFrame(records).to_csv(args.csv, index=False)
    sys.stdout.write(markdown(records, peers))


if __name__ == "__main__":
    main()
