"""The end-of-run tables of the inference shapes (decoding, packed batches), and their JSON."""

from __future__ import annotations

from typing import Any

from rich.markup import escape
from rich.table import Table

from attnbench.bench.summary import SpeedRun
from attnbench.cli.common import out


def _num(x: Any, fmt: str) -> str:
    try:
        return "-" if x is None or x != x else fmt.format(x)
    except (TypeError, ValueError):
        return "-"


def _impl(r: dict[str, Any]) -> str:
    return escape(r["impl"] + (f" [{r['params']}]" if r.get("params") and "kv_heads" in
                               r["params"] else ""))  # fmt: skip


def print_decode(rows: list[dict[str, Any]], fastest: list[dict[str, Any]]) -> None:
    """One row per decode form and number of new queries, at the longest cache it reached."""
    table = Table(
        title="decoding (at each form's longest cache n)",
        caption="ms/token: time per call / new queries; % copy: bytes/s over a copy's in the "
        "same rounds (the memory roofline); exp: fitted slope of log time vs log n ('?': not a "
        "reliable trend, see complexity.csv)",
    )
    for name in ("impl", "q", "n", "ms/token", "tokens/s", "GB/s", "% copy", "state MiB",
                 "x ref", "exp", "ok"):  # fmt: skip
        table.add_column(name, justify="left" if name == "impl" else "right", no_wrap=True)
    for r in rows:
        if "n" not in r:
            continue
        table.add_row(
            _impl(r), str(r["query_len"]), str(r["n"]), _num(r["ms_per_token"], "{:.3g}"),
            _num(r["tokens_per_s"], "{:.4g}"), _num(r["gb_per_s"], "{:.3g}"),
            _num(r["copy_fraction"], "{:.0%}"), _num((r["state_bytes"] or 0) / 2**20, "{:.3g}"),
            _num(r["ref_ratio"], "{:.2f}"),
            "?" if r["time_exp"] is None else _num(r["time_exp"], "{:.2f}"), r["ok"],
        )  # fmt: skip
    out.print(table)
    never = sorted({f"{r['impl']} ({r.get('reason', '')})" for r in rows if "n" not in r})
    if never:
        out.print("[dim]no decode row: " + escape("; ".join(never)) + "[/dim]", soft_wrap=True)
    by_q: dict[int, list[str]] = {}
    for f in fastest:
        by_q.setdefault(f["query_len"], []).append(f"n={f['n']}: {f['impl']}")
    for tq, items in by_q.items():
        out.print(
            f"fastest decode, {tq} new quer{'y' if tq == 1 else 'ies'}: " + escape(", ".join(items))
        )


def print_packed(rows: list[dict[str, Any]]) -> None:
    """One row per path that ran: packed and padded time at the same tokens, and packing's
    speed-up; the paths that ran neither way folded into one line with their reasons."""
    lengths = [int(x) for x in str(rows[0]["varlen"]).split("+")]
    shown = "+".join(map(str, lengths)) if len(lengths) <= 12 else f"{len(lengths)} sequences"
    table = Table(
        title=f"packed batch ({shown}: {sum(lengths)} tokens) against padding to the longest",
        caption="packed: the sequences end to end (packed-loop: a loop over them); padded: "
        "one row per sequence, each the longest; speed-up: padded / packed, same rounds",
    )
    for name in ("impl", "series", "packing", "packed ms", "padded ms", "speed-up"):
        table.add_column(name, justify="left" if name in ("impl", "packing") else "right")
    ran = [r for r in rows if "packed_ms" in r or "padded_ms" in r]
    for r in ran:
        table.add_row(
            _impl(r), r["series"], r["packing"], _num(r.get("packed_ms"), "{:.3g}"),
            _num(r.get("padded_ms"), "{:.3g}"), _num(r.get("speedup"), "{:.2f}x"),
        )  # fmt: skip
    if ran:
        out.print(table)
    never = sorted({f"{r['impl']} ({r.get('reason', '')})" for r in rows if r not in ran})
    if never:
        out.print("[dim]no packed row: " + escape("; ".join(never)) + "[/dim]", soft_wrap=True)


def print_inference(run: SpeedRun) -> bool:
    """The decoding and packed-batch tables of ``run``; whether it had any such row."""
    from attnbench.bench.inference_summary import decode_rows, fastest_decoder, packed_rows

    decode = decode_rows(run.rows, run.exponents)
    packed = packed_rows(run.rows)
    if decode:
        print_decode(decode, fastest_decoder(run.rows))
    if packed:
        print_packed(packed)
    return bool(decode or packed)


def inference_json(run: SpeedRun) -> dict[str, Any]:
    """The same as JSON values: ``decode``, ``fastest_decode`` and ``packed`` lists."""
    from attnbench.bench.inference_summary import decode_rows, fastest_decoder, packed_rows

    return {
        "decode": [_plain(r) for r in decode_rows(run.rows, run.exponents)],
        "fastest_decode": [_plain(r) for r in fastest_decoder(run.rows)],
        "packed": [_plain(r) for r in packed_rows(run.rows)],
    }


def _plain(row: dict[str, Any]) -> dict[str, Any]:
    """JSON values: numpy scalars as Python numbers, a missing number (NaN, NA) as null."""
    from attnbench.bench.results import plain

    return {key: plain(value) for key, value in row.items()}
