"""A CPU's *class*: the part of its signature (:func:`attnbench.measure.machine.cpu_signature`)
that decides relative times. No torch import: the results history reads it from sidecars."""

from __future__ import annotations

import re


def cpu_class(signature: str) -> str:
    """``authenticamd-25-1-avx2`` from ``AuthenticAMD 25/1/1 avx2; torch AVX2``: vendor, family
    and model, the instruction sets torch dispatches on; no stepping, no torch version (a
    baseline also records the torch version, and ``compare`` checks it)."""
    cpu = signature.split(";")[0].strip()
    parts = cpu.split()
    vendor = parts[0] if parts else "unknown"
    ident = parts[1].split("/")[:2] if len(parts) > 1 else []
    isa = parts[2].replace(",", "-") if len(parts) > 2 else ""
    slug = "-".join([vendor, *ident, isa] if isa and isa != "-" else [vendor, *ident])
    return re.sub(r"[^a-z0-9_.-]+", "-", slug.lower()).strip("-")
