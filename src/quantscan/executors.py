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

import contextlib
import copy
import importlib.util
import json
import multiprocessing
import os
import socket
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from pathlib import Path
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
    what its nodes were started with. Ray's own log lines (Python and native) go to a file, not the
    user's terminal: a failure says it in one line, with Ray's last line."""
    check_reachable(address)
    with _ray_log_captured() as log:
        try:
            if address is None and resources:
                try:
                    ray.init(address=None, include_dashboard=False, log_to_driver=False,
                             resources=dict(resources))
                    return
                except ValueError:  # a `ray start` runs here: it offers what it was started with
                    pass
            ray.init(address=address, include_dashboard=False, log_to_driver=False)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            if address is None and not isinstance(exc, ValueError):
                raise
            raise _unreachable(address or "the default address", exc, log) from None


@contextlib.contextmanager
def _ray_log_captured() -> Iterator[Path]:
    """fd 2 into a temporary file while Ray starts: its Python loggers and its C++ core both write there."""
    sys.stderr.flush()
    with tempfile.TemporaryDirectory(prefix="quantscan-ray-") as tmp:
        path = Path(tmp) / "ray.log"
        saved = os.dup(2)
        try:
            with path.open("wb") as sink:
                os.dup2(sink.fileno(), 2)
                try:
                    yield path
                finally:
                    sys.stderr.flush()
                    os.dup2(saved, 2)
        finally:
            os.close(saved)


RAY_CLIENT_INSTALL = "pip install 'ray[client]'"
SPECIAL_ADDRESSES = ("auto", "local")
"""Addresses `ray.init` understands without a host: the cluster `ray start` runs here, a new local one."""


def check_address_form(address: str | None) -> None:
    """The forms users slip on, each refused before Ray is asked: an empty value (an unset shell variable),
    the dashboard's http:// URL, a ray:// Ray Client address without `ray[client]`, no port, a bad port."""
    if address is None or address in SPECIAL_ADDRESSES:
        return
    expected = ("--ray-address: expected HOST:PORT of a Ray head's GCS (what `ray start --head` prints, "
                "e.g. 10.0.0.5:6379)")
    if not address.strip():
        raise UsageError(f"{expected}, found an empty address (an unset variable?)")
    scheme = address.split("://", 1)[0].lower() if "://" in address else ""
    if scheme in ("http", "https"):
        raise UsageError(f"{expected}, found the URL {address!r}, which is the dashboard's form (port 8265): "
                         "give the GCS host and port without http://")
    if scheme == "ray":
        if importlib.util.find_spec("grpc") is None:
            raise UsageError(f"{expected}, found the Ray Client address {address!r}, which needs "
                             f"{RAY_CLIENT_INSTALL} (not installed here); or give the GCS address HOST:PORT")
        return
    if scheme:
        raise UsageError(f"{expected}, found {address!r} ({scheme}:// is no address Ray joins)")
    host, _, port = address.rpartition(":")
    if not host:
        raise UsageError(f"{expected}, found {address!r} with no port")
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise UsageError(f"{expected}, found port {port!r} in {address!r} (expected 1-65535)")


GCS_PROBE_TIMEOUT_S = 3.0
"""Seconds the probe waits for the HTTP/2 answer a Ray GCS (a gRPC server) gives at once."""
HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])
"""The HTTP/2 client preface and an empty SETTINGS frame (RFC 9113 §3.4): a gRPC server answers with its
own SETTINGS frame (type 4, at byte 3); a web server answers HTTP/1.x text or closes."""


def check_reachable(address: str | None) -> None:
    """A `--ray-address` of the wrong form, where nothing listens or where something other than a Ray GCS
    listens is refused at once, in one line (the CLI checks before it claims the run folder). Why the
    probe: ray.init at a web server's port retried for minutes and printed Ray's native warnings."""
    check_address_form(address)
    if address is None or address in SPECIAL_ADDRESSES or "://" in address:
        return
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=CONNECT_TIMEOUT_S) as conn:
            answer = _gcs_answer(conn)
    except (OSError, ValueError) as exc:
        raise _unreachable(address, exc) from None
    if len(answer) < 9 or answer[3] != 4:
        raise UsageError(f"--ray-address: expected a Ray GCS at {address} (it answers HTTP/2), found "
                         f"{_describe(answer)}; give the port `ray start --head` printed (default 6379)")


def _gcs_answer(conn: socket.socket) -> bytes:
    """The first bytes the server sends after the HTTP/2 preface (b"" when it closes or stays silent)."""
    conn.settimeout(GCS_PROBE_TIMEOUT_S)
    try:
        conn.sendall(HTTP2_PREFACE)
        data = b""
        while len(data) < 9:
            chunk = conn.recv(64)
            if not chunk:
                break
            data += chunk
        return data
    except (TimeoutError, OSError):
        return b""


def _describe(answer: bytes) -> str:
    """What answered, in a few printable characters."""
    if not answer:
        return f"a server that gave no HTTP/2 answer within {GCS_PROBE_TIMEOUT_S:g} s"
    first = answer.split(b"\n", 1)[0].decode("ascii", "replace")
    shown = "".join(c if c.isprintable() else "?" for c in first)[:40]
    return f"another kind of server (it answered {shown!r})"


def _unreachable(address: str, exc: BaseException, log: Path | None = None) -> UsageError:
    why = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    last = _last_line(log) if log is not None else ""
    why += f" (Ray's log: {last})" if last and last not in why else ""
    return UsageError(f"--ray-address: expected a running Ray cluster at {address} (start its head there; "
                      f"with token auth, RAY_AUTH_MODE=token and its ~/.ray/auth_token here), found: {why}")


def _last_line(log: Path) -> str:
    """Ray's last log line, cut short (its log is Ray's, not a user file)."""
    try:
        lines = [ln.strip() for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    return lines[-1][:200] if lines else ""


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
