"""The executor seam: `map_shards(fn, common, shards)` runs `fn(common, shard, threads)` for every shard
and returns the results in shard order, whichever backend ran them.

Why one seam: pass 1, pass 2 and the gain ranking all split their work the same way (sample ranges,
candidate lists) and merge in shard order; only *where* a shard runs differs. The backends:
- `serial`: every shard in this process, one after another (the reference the others must equal);
- `process`: today's `--workers N`, N-1 spawned processes and this one, which takes shard 0 with the
  samples it already has open (scanning/workers.py says why);
- `ray`: one Ray actor per worker on a local or remote Ray cluster. `common` (the model bytes, the plan,
  the sites) goes into the object store once per map and every task gets its reference; a shard is a
  sample range and a folder path (or a candidate list), never arrays copied per task. An actor sets its
  onnxruntime thread count from the CPUs Ray assigned it, keeps its imports warm between maps, and is
  restarted and its task retried when its process dies.

A shard's result depends only on the shard, never on the backend, so merging in shard order gives the
same bytes from every backend. `fn` must be a module-level function (it is pickled by reference).
"""

from __future__ import annotations

import copy
import json
import multiprocessing
import os
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from typing import Any, Protocol, TypeVar

from quantscan.errors import UsageError

EXECUTORS = ("serial", "process", "ray")
RAY_INSTALL = "pip install 'quantscan[ray]'"
CONNECT_TIMEOUT_S = 10.0
RAY_RETRIES = 2
"""How often Ray restarts a dead actor and re-runs the task it held (a killed or OOM-killed process)."""

Common = TypeVar("Common")
Shard = TypeVar("Shard")
Result = TypeVar("Result")
ShardFn = Callable[[Any, Any, "int | None"], Any]


class Executor(Protocol):
    """Where shards run. `workers`: how many run at once (the shard count callers aim for)."""

    name: str
    workers: int

    def map_shards(self, fn: Callable[[Common, Shard, int | None], Result], common: Common,
                   shards: Sequence[Shard], local: Callable[[Common, Shard, int | None], Result] | None = None,
                   ) -> list[Result]:
        """`fn(common, shard, threads)` for every shard, results in shard order; `local`: the same work
        done with what this process already holds (open samples), used for shards run here."""
        ...

    def map_tasks(self, fn: Callable[[Common, Shard, int | None], Result], common: Common, items: Sequence[Shard],
                  resources: Mapping[str, float] | None = None) -> list[Result]:
        """`fn(common, item, threads)` for every item, results in item order, up to `workers` at once: tasks
        that wait on something else (a vendor build in its own subprocess), so locally they are threads;
        under Ray each is a task that needs `resources` (e.g. {"toolchain:rknn": 1}: a node that has it)."""
        ...

    def close(self) -> None:
        """Stop what the executor started (processes, actors, a Ray it started itself)."""
        ...


def threads_per_worker(total: int | None, workers: int, cpus: int | None = None) -> int:
    """onnxruntime threads each worker's sessions get: the run's thread total split evenly."""
    return max(1, (total or cpus or os.cpu_count() or 1) // workers)


class SerialExecutor:
    """Every shard here, in order: the reference result, and `--workers N` without extra processes."""

    name = "serial"

    def __init__(self, workers: int = 1, threads: int | None = None) -> None:
        self.workers, self.threads = workers, threads

    def map_shards(self, fn: Callable[[Common, Shard, int | None], Result], common: Common,
                   shards: Sequence[Shard], local: Callable[[Common, Shard, int | None], Result] | None = None,
                   ) -> list[Result]:
        run = local if local is not None else fn
        return [run(common, shard, self.threads) for shard in shards]

    def map_tasks(self, fn: Callable[[Common, Shard, int | None], Result], common: Common, items: Sequence[Shard],
                  resources: Mapping[str, float] | None = None) -> list[Result]:
        return in_threads(fn, common, items, self.workers, self.threads)

    def close(self) -> None:
        return None


def in_threads(fn: Callable[[Common, Shard, int | None], Result], common: Common, items: Sequence[Shard],
               workers: int, threads: int | None) -> list[Result]:
    """Items in up to `workers` threads of this process (each item's work is a subprocess: the threads
    only wait), results in item order; one worker: in order, here."""
    if workers <= 1 or len(items) <= 1:
        return [fn(common, item, threads) for item in items]
    with ThreadPoolExecutor(max_workers=min(workers, len(items))) as pool:
        futures = [pool.submit(fn, common, item, threads) for item in items]
        return [future.result() for future in futures]


class ProcessExecutor:
    """`workers - 1` spawned processes beside this one (fork would copy onnxruntime's threads and locks
    mid-use), started at once so each imports quantscan and onnxruntime while this process loads and
    probes the model; shard 0 runs here (see scanning/workers.py for why)."""

    name = "process"

    def __init__(self, workers: int, threads: int | None = None) -> None:
        self.workers, self.threads = workers, threads
        children = max(1, workers - 1)
        self.pool = ProcessPoolExecutor(max_workers=children, mp_context=multiprocessing.get_context("spawn"))
        for _ in range(children):
            self.pool.submit(_started)

    def map_shards(self, fn: Callable[[Common, Shard, int | None], Result], common: Common,
                   shards: Sequence[Shard], local: Callable[[Common, Shard, int | None], Result] | None = None,
                   ) -> list[Result]:
        if not shards:
            return []
        threads = threads_per_worker(self.threads, min(self.workers, len(shards)))
        futures = [self.pool.submit(fn, common, shard, threads) for shard in shards[1:]]
        try:
            first = (local if local is not None else fn)(common, shards[0], threads)
        except BaseException:
            for future in futures:
                future.cancel()
            raise
        return [first, *(future.result() for future in futures)]

    def map_tasks(self, fn: Callable[[Common, Shard, int | None], Result], common: Common, items: Sequence[Shard],
                  resources: Mapping[str, float] | None = None) -> list[Result]:
        """Threads here, not the pool's processes: the tasks are subprocesses already (module docstring)."""
        return in_threads(fn, common, items, self.workers, self.threads)

    def close(self) -> None:
        self.pool.shutdown(cancel_futures=True)


def _started() -> None:
    """A warm-up task: unpickling it imports this module in the worker; the pause lets the next warm-up
    task reach the other process."""
    time.sleep(0.3)


def import_ray() -> Any:
    """The `ray` module, or the one-line usage error that says how to install it."""
    try:
        import ray
    except ImportError:
        raise UsageError(f"--executor ray: expected the Ray extra installed, found no `ray` module; "
                         f"{RAY_INSTALL}") from None
    return ray


class ShardActor:
    """A Ray actor's body: runs shard functions with the onnxruntime thread count its CPUs allow."""

    def __init__(self) -> None:
        import ray

        cpus = ray.get_runtime_context().get_assigned_resources().get("CPU", 1.0)
        self.threads = max(1, int(cpus))

    def run(self, fn: ShardFn, common: Any, shard: Any) -> Any:
        return fn(common, shard, self.threads)

    def pid(self) -> int:
        return os.getpid()


def run_task(fn: ShardFn, common: Any, item: Any) -> Any:
    """A Ray task's body (`RayExecutor.map_tasks`): the item, with no thread count of its own."""
    return fn(common, item, None)


class RayExecutor:
    """One actor per worker on a Ray cluster (`address`: ADDR of `ray start --head`, or None: the Ray this
    process already joined, else Ray's own default: the cluster `ray start` runs on this machine, else a
    new local one). Shards go to the actors round-robin.
    `workers` is capped by the cluster's CPUs: an actor asks for `cpus_per_actor` of them."""

    name = "ray"

    def __init__(self, workers: int, address: str | None = None, cpus_per_actor: float = 1.0,
                 resources: Mapping[str, float] | None = None) -> None:
        ray = import_ray()
        self.ray, self.started = ray, False
        if not ray.is_initialized():
            join(ray, address, resources)
            self.started = True
        cluster_cpus = int(ray.cluster_resources().get("CPU", 1))
        self.workers = max(1, min(workers, int(cluster_cpus // cpus_per_actor) or 1))
        remote = ray.remote(num_cpus=cpus_per_actor, max_restarts=RAY_RETRIES,
                            max_task_retries=RAY_RETRIES)(ShardActor)
        self.actors = [remote.remote() for _ in range(self.workers)]

    def map_shards(self, fn: Callable[[Common, Shard, int | None], Result], common: Common,
                   shards: Sequence[Shard], local: Callable[[Common, Shard, int | None], Result] | None = None,
                   ) -> list[Result]:
        if not shards:
            return []
        ref = self.ray.put(common)  # once per map: every task gets the reference, not a copy
        return self._gather([self.actors[k % len(self.actors)].run.remote(fn, ref, shard)
                             for k, shard in enumerate(shards)])

    def map_tasks(self, fn: Callable[[Common, Shard, int | None], Result], common: Common, items: Sequence[Shard],
                  resources: Mapping[str, float] | None = None) -> list[Result]:
        """One Ray task per item on a node offering `resources` (no CPU asked: the actors may hold them all,
        and the resource's count is how many of these a node runs at once); refused at once when no node
        offers them (Ray would wait for such a node forever)."""
        if not items:
            return []
        wanted = dict(resources or {})
        check_offered(self.ray.cluster_resources(), wanted)
        remote = self.ray.remote(num_cpus=0, resources=wanted or None, max_retries=RAY_RETRIES)(run_task)
        ref = self.ray.put(common)
        return self._gather([remote.remote(fn, ref, item) for item in items])

    def _gather(self, pending: list[Any]) -> list[Any]:
        """The tasks' results in order, each this process' own copy (Ray hands numpy arrays back as
        read-only views of the object store, and the merges add shards into the first one's sums in
        place); on any failure or interrupt the tasks still running are cancelled."""
        try:
            return [copy.deepcopy(result) for result in self.ray.get(pending)]
        except BaseException:
            for task in pending:
                self.ray.cancel(task)
            raise

    def close(self) -> None:
        for actor in self.actors:
            self.ray.kill(actor)
        self.actors = []
        if self.started:
            self.ray.shutdown()


def check_offered(cluster: Mapping[str, float], wanted: Mapping[str, float]) -> None:
    """Every resource a task needs is offered by some node of the cluster, else one line saying what to start."""
    missing = {k: v for k, v in wanted.items() if cluster.get(k, 0.0) < v}
    if missing:
        offer = json.dumps({k: max(1, int(v)) for k, v in missing.items()})
        raise UsageError(f"--executor ray: expected a node offering {', '.join(missing)}, found none in the cluster; "
                         f"start one where the toolchain's Python is: ray start --address HEAD_IP:6379 "
                         f"--resources '{offer}'")


def join(ray: Any, address: str | None, resources: Mapping[str, float] | None = None) -> None:
    """`ray.init` at `address` (None: Ray's default); a cluster that cannot be reached is bad input.
    Why the socket first: Ray's client retries an address where nothing listens for minutes. `resources`:
    what a Ray this process starts itself offers (its own machine's toolchains); a running cluster keeps
    what its nodes were started with."""
    check_reachable(address)
    try:
        if address is None and resources:
            try:
                ray.init(address=None, include_dashboard=False, log_to_driver=False, resources=dict(resources))
                return
            except ValueError:  # a `ray start` runs here: it offers what it was started with
                pass
        ray.init(address=address, include_dashboard=False, log_to_driver=False)
    except (ConnectionError, RuntimeError) as exc:
        if address is None:
            raise
        raise _unreachable(address, exc) from None


def check_reachable(address: str | None) -> None:
    """A HOST:PORT `--ray-address` where nothing listens is refused at once (the CLI checks before it
    claims the run folder)."""
    if address is None or ":" not in address or "://" in address:
        return
    host, port = address.rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT_S).close()
    except (OSError, ValueError) as exc:
        raise _unreachable(address, exc) from None


def _unreachable(address: str, exc: BaseException) -> UsageError:
    why = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return UsageError(f"--ray-address: expected a running Ray cluster at {address} (start its head there; "
                      f"with token auth, RAY_AUTH_MODE=token and its ~/.ray/auth_token here), found: {why}")


def make_executor(name: str | None, workers: int, *, threads: int | None = None,
                  ray_address: str | None = None, resources: Mapping[str, float] | None = None) -> Executor:
    """The backend `--executor` names; None: `process` when `workers` > 1, else `serial`. `resources`: what a
    local Ray started here offers (`RayExecutor`)."""
    chosen = name or ("process" if workers > 1 else "serial")
    if chosen == "serial":
        return SerialExecutor(workers, threads)
    if chosen == "process":
        return ProcessExecutor(workers, threads)
    if chosen == "ray":
        return RayExecutor(workers, ray_address, resources=resources)
    raise UsageError(f"--executor: expected one of {', '.join(EXECUTORS)}, found {name!r}")
