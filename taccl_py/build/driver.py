"""Run a build's instances on an engine: as many at once as it has slots, retrying failures, writing results.

An engine starts an instance's task (``submit``) and hands back whichever have finished (``wait``),
each with its result or its error; it never writes a file. The driver writes a result once its task
succeeded, retries a failed or lost task up to ``retries`` times, and reports each change of state
through the caller's progress callback.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from taccl_py.build.instance import Instance, InstanceResult
from taccl_py.build.output import write_instance
from taccl_py.errors import ArgumentError

__all__ = ["DEFAULT_RETRIES", "BuildReport", "Engine", "InstanceOutcome", "check_retries", "run_instances"]

logger = logging.getLogger(__name__)

#: Attempts after the first that a failed or lost instance gets.
DEFAULT_RETRIES = 2
_RUNNING_NAMED = 4  # running instances a progress line names before it says "and N more"


class Engine(Protocol):
    """Where instances run: ``slots`` at once, each task returning an ``InstanceResult`` or failing."""

    name: str
    slots: int

    def submit(self, instance: Instance) -> object:
        """Start building ``instance``; return a handle for ``wait``."""

    def wait(self, handles: Collection[object]) -> list[tuple[object, InstanceResult | str]]:
        """Block until one or more of ``handles`` finished; return each with its result or its error line."""

    def close(self) -> None:
        """End every task still running and let go of the engine's resources."""


@dataclass(frozen=True)
class InstanceOutcome:
    """How one instance went: its result (None when every attempt failed), the errors of failed attempts."""

    instance: Instance
    result: InstanceResult | None
    errors: tuple[str, ...]
    written: tuple[Path, ...] = ()

    @property
    def attempts(self) -> int:
        """Return how many times the instance was started."""
        return len(self.errors) + (self.result is not None)


@dataclass(frozen=True)
class BuildReport:
    """Every instance's outcome, in the order the instances were given."""

    engine: str
    outcomes: tuple[InstanceOutcome, ...]

    @property
    def failed(self) -> tuple[InstanceOutcome, ...]:
        """Return the outcomes of instances no attempt built."""
        return tuple(outcome for outcome in self.outcomes if outcome.result is None)

    @property
    def retried(self) -> tuple[InstanceOutcome, ...]:
        """Return the outcomes of instances built after one or more failed attempts."""
        return tuple(outcome for outcome in self.outcomes if outcome.result is not None and outcome.errors)


def run_instances(
    engine: Engine,
    instances: Sequence[Instance],
    output_dir: str | Path | None,
    *,
    retries: int = DEFAULT_RETRIES,
    progress: Callable[[str], None] | None = None,
    on_result: Callable[[InstanceResult], None] | None = None,
) -> BuildReport:
    """Build ``instances`` on ``engine``, writing each result under ``output_dir`` (None: nowhere); return the report.

    ``output_dir`` is made when missing (not its parents). ``on_result`` is called with each result
    once written. The engine is closed on the way out, which ends its running tasks when an exception
    (Ctrl-C included) leaves early.

    Raises
    ------
    ArgumentError
        When ``retries`` is negative, or a result cannot be written under ``output_dir``.
    """
    check_retries(retries)
    pending = deque(dict.fromkeys(instances))
    errors: dict[Instance, list[str]] = {instance: [] for instance in pending}
    outcomes: dict[Instance, InstanceOutcome] = {}
    running: dict[object, Instance] = {}
    say = progress or (lambda _line: None)
    say(f"{len(pending)} instances on the {engine.name} engine, {engine.slots} at once")
    try:
        if output_dir is not None:
            Path(output_dir).mkdir(exist_ok=True)
        while pending or running:
            started = []
            while pending and len(running) < engine.slots:
                started.append(pending.popleft())
                running[engine.submit(started[-1])] = started[-1]
            if started:
                labels = ", ".join(instance.label for instance in started)
                say(f"started {labels}; {_state_line(len(outcomes), len(errors), running.values())}")
            for handle, found in engine.wait(tuple(running)):
                instance = running.pop(handle)
                if isinstance(found, InstanceResult):
                    written = () if output_dir is None else write_instance(found, output_dir)
                    outcomes[instance] = InstanceOutcome(instance, found, tuple(errors[instance]), written)
                    event = f"built {instance.label} in {found.metrics['wall_s']:.1f} s"
                    if on_result is not None:
                        on_result(found)
                else:
                    errors[instance].append(found)
                    tries = len(errors[instance])
                    if tries <= retries:
                        pending.appendleft(instance)
                        event = f"{instance.label} failed (attempt {tries} of {retries + 1}), retrying: {found}"
                    else:
                        outcomes[instance] = InstanceOutcome(instance, None, tuple(errors[instance]))
                        event = f"{instance.label} failed (attempt {tries} of {retries + 1}), giving up: {found}"
                say(f"{event}; {_state_line(len(outcomes), len(errors), running.values())}")
    finally:
        engine.close()
    return BuildReport(engine.name, tuple(outcomes[instance] for instance in errors))


def check_retries(retries: int) -> int:
    """Return ``retries``; raise ``ArgumentError`` unless it is a whole number from 0."""
    if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
        raise ArgumentError(None, "retries", f"{retries!r} retries", "a whole number from 0")
    return retries


def _state_line(done: int, total: int, running: Collection[Instance]) -> str:
    """Return ``3 of 8 instances done, 2 running: ndv2 n2 allreduce, dgx1 n1 allgather``."""
    line = f"{done} of {total} instances done, {len(running)} running"
    if not running:
        return line
    labels = [instance.label for instance in running]
    more = f" and {len(labels) - _RUNNING_NAMED} more" if len(labels) > _RUNNING_NAMED else ""
    return f"{line}: {', '.join(labels[:_RUNNING_NAMED])}{more}"
