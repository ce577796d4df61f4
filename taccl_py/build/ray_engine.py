"""The Ray engine: each instance a Ray task that returns its files' bytes and metrics to the driver.

Without an address it starts a Ray of its own on this machine (``ray.init(num_cpus=...)``, no
dashboard) and shuts it down at the end; with ``HOST:PORT`` it joins a running cluster, whose
workers must have taccl_py installed. Each task runs in a fresh worker process (``max_calls=1``), so
its peak memory is its own, and asks for as many CPUs as its synthesis has worker processes. Ray
retries nothing itself (``max_retries=0``): the driver retries, and reports, every failure alike. A
task still running ``instance_timeout_s`` after it was submitted is cancelled (its worker killed) and
reported as timed out, as the local engine does with its worker processes.
Ray is imported only here, when the engine is made, so taccl_py imports without it.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Collection
from typing import Any

from taccl_py.build.instance import BuildOptions, Instance, InstanceResult, instance_timeout_s, timed_out_error
from taccl_py.build.run import FAULTS_ENV, build_instance
from taccl_py.errors import ArgumentError, install_hint
from taccl_py.synth.jobs import available_cores

__all__ = ["RayEngine"]

logger = logging.getLogger(__name__)

_CONNECT_TIMEOUT_S = 10.0  # how long the head of a cluster has to accept a connection before we give up


def _build_task(instance: Instance, options: BuildOptions) -> InstanceResult:
    """Build one instance in a Ray worker (a module-level function, so workers import it by name)."""
    return build_instance(instance, options)


class RayEngine:
    """Build instances as Ray tasks on a local Ray or a cluster (the driver's ``Engine``)."""

    name = "ray"

    def __init__(
        self,
        options: BuildOptions,
        *,
        address: str | None = None,
        slots: int | None = None,
        timeout_s: float | None = None,
    ) -> None:
        try:
            import ray
        except ImportError:
            raise ArgumentError(None, "engine", "ray needs Ray, which is not installed", install_hint("ray")) from None
        if slots is not None and (isinstance(slots, bool) or not isinstance(slots, int) or slots < 1):
            raise ArgumentError(None, "jobs", f"{slots!r} instances at once", "a positive number of Ray tasks")
        self._ray = ray
        self._started = not ray.is_initialized()
        if self._started:
            settings: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False}
            if os.environ.get(FAULTS_ENV):  # a cluster's workers do not share the driver's environment
                settings["runtime_env"] = {"env_vars": {FAULTS_ENV: os.environ[FAULTS_ENV]}}
            if address is None:
                cores = slots * options.jobs if slots is not None else available_cores()
                ray.init(num_cpus=cores, logging_level=logging.WARNING, **settings)
            else:
                _join(ray, address, settings)
        cpus = int(ray.cluster_resources().get("CPU", 1))
        self.slots = slots if slots is not None else max(1, cpus // options.jobs)
        self.options = options
        self.timeout_s = instance_timeout_s(options) if timeout_s is None else timeout_s
        self._task = ray.remote(num_cpus=options.jobs, max_calls=1, max_retries=0)(_build_task)
        self._deadlines: dict[object, float] = {}  # running task -> time.monotonic() it is cancelled at
        logger.info("Ray with %d CPUs, %d instances at once", cpus, self.slots)

    def submit(self, instance: Instance) -> object:
        """Start a Ray task building ``instance``; return its object reference."""
        ref = self._task.remote(instance, self.options)
        self._deadlines[ref] = time.monotonic() + self.timeout_s
        return ref

    def wait(self, handles: Collection[object]) -> list[tuple[object, InstanceResult | str]]:
        """Block until one or more tasks of ``handles`` finished or ran out of time; return their results or errors."""
        ray = self._ray
        refs = list(handles)
        first_deadline = min(self._deadlines[ref] for ref in refs)
        ready, _ = ray.wait(refs, num_returns=1, timeout=max(0.0, first_deadline - time.monotonic()))
        ready += [ref for ref in ray.wait(refs, num_returns=len(refs), timeout=0)[0] if ref not in ready]
        finished: list[tuple[object, InstanceResult | str]] = []
        for ref in ready:
            self._deadlines.pop(ref, None)
            try:
                finished.append((ref, ray.get(ref)))
            except ray.exceptions.RayError as error:
                finished.append((ref, _error_line(error)))
        now = time.monotonic()
        for ref in refs:
            if ref not in ready and self._deadlines[ref] <= now:
                ray.cancel(ref, force=True)
                del self._deadlines[ref]
                finished.append((ref, timed_out_error(self.timeout_s)))
        return finished

    def close(self) -> None:
        """Cancel the tasks still running; shut Ray down when this engine started it."""
        for ref in self._deadlines:
            self._ray.cancel(ref, force=True)
        self._deadlines.clear()
        if self._started:
            self._ray.shutdown()


def _join(ray: Any, address: str, settings: dict[str, Any]) -> None:
    """Connect to the Ray cluster at ``address``; raise ``ArgumentError`` with Ray's reason when that fails."""
    _check_reachable(address)
    try:
        ray.init(address=address, logging_level=logging.WARNING, **settings)
    except (ConnectionError, ValueError, ray.exceptions.RayError) as error:
        root: BaseException = error
        while root.__cause__ is not None:  # the cluster's own reason (a wrong auth token, say) is the innermost
            root = root.__cause__
        reason = next((line for line in str(root).splitlines() if line.strip()), type(root).__name__)
        raise ArgumentError(
            None,
            "address",
            f"cannot join the Ray cluster at {address}: {reason.split('. ')[0]}",
            "the HOST:PORT of a running Ray cluster (ray start --head prints it)",
        ) from None


def _check_reachable(address: str) -> None:
    """Raise ``ArgumentError`` when nothing listens at ``HOST:PORT`` (Ray itself retries such an address for minutes).

    Other forms Ray takes (``auto``, ``ray://...``) are left to Ray.
    """
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit() or "://" in address:
        return
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=_CONNECT_TIMEOUT_S).close()
    except OSError as error:
        reason = error.strerror or str(error) or type(error).__name__
        raise ArgumentError(
            None, "address", f"cannot reach {address}: {reason}", "the HOST:PORT of a running Ray cluster's head"
        ) from None


def _error_line(error: Exception) -> str:
    """Return one line for a failed task: the task's own exception, or the worker's loss."""
    cause = getattr(error, "cause", None)
    if isinstance(cause, Exception):
        return f"{type(cause).__name__}: {cause}"
    first = next((line.strip() for line in str(error).splitlines() if line.strip()), "")
    return f"{type(error).__name__}: {first}" if first else type(error).__name__
