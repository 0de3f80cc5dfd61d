"""The unit contract of both experiments: a run is a list of :class:`Unit`, in plan order, which
every engine (worker processes here, Ray tasks, the shards of an array job) runs the same way.

A speed sweep's units (:class:`attnbench.bench.units.Unit`) each time one mechanism over a group of
cases; an extrapolation run's (:mod:`attnbench.extrapolation.experiment.units`) are its trainings,
then one evaluation that needs them all. Both extend this record with their own fields (listed by
:meth:`Unit.details`), and list, shard and mark done their units through it.

``--shard I/N`` runs the units whose ``index`` is I mod N (:func:`attnbench.runtime.engines.
in_shard`). No torch here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

from attnbench.runtime.engines import in_shard

U = TypeVar("U", bound="Unit")


@dataclass(frozen=True)
class Unit:
    """One unit of work; its experiment's subclass adds what the unit runs.

    ``Unit(4, "evaluate", kind="evaluation", needs=("train-O-seed0",), done=False)``
    """

    index: int  # position in plan order; the unit of shard ``index mod N``
    id: str  # stable across runs of the same plan: folder names, logs, fault injection
    kind: str = field(kw_only=True)  # what it does: "speed", "training", "evaluation"
    needs: tuple[str, ...] = field(default=(), kw_only=True)  # ids that must be done first
    #: Whether its output is already there, when the listing knows it (None: not listed).
    done: bool | None = field(default=None, kw_only=True)

    #: Whether ``kind`` is in :meth:`as_dict` (the speed sweep's listing, of one kind only,
    #: predates the field and keeps its shape).
    LISTS_KIND: ClassVar[bool] = True

    def shard_of(self, n: int) -> int:
        """The shard, of ``n``, that runs this unit."""
        return self.index % n

    def in_shard(self, shard: tuple[int, int] | None) -> bool:
        """Whether shard (I, N) runs this unit (None: no shards, every unit)."""
        return in_shard(self.index, shard)

    def details(self) -> dict[str, Any]:
        """The experiment's own fields, as ``--list-units`` shows them (after index, id, kind)."""
        return {}

    def as_dict(self, shard: tuple[int, int] | None = None) -> dict[str, Any]:
        """One entry of ``--list-units --format json``; under ``--shard I/N`` with the shard
        that runs it."""
        listed: dict[str, Any] = {"index": self.index, "id": self.id}
        if self.LISTS_KIND:
            listed["kind"] = self.kind
        listed.update(self.details())
        if self.needs:
            listed["needs"] = list(self.needs)
        if self.done is not None:
            listed["done"] = self.done
        if shard is not None:
            listed["shard"] = self.shard_of(shard[1])
        return listed


def shard_units(units: Sequence[U], shard: tuple[int, int] | None) -> list[U]:
    """The units shard (I, N) runs, in plan order (None: all of them)."""
    return [u for u in units if u.in_shard(shard)]
