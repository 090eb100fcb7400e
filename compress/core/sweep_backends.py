"""Where a sweep's cells run: child processes of the driver (``local``) or Ray tasks (``ray``).

A backend starts a cell (one ``compress`` command line, its output to the cell's log file) and
reports the cells that ended with their exit code. Planning, resume and reporting stay in
``compress.recipes.sweep``: both backends see the same plan, skip the same finished cells and record the
same statuses, so a sweep started on one machine can be resumed on a cluster and the other way
round.

The Ray backend turns every cell into a Ray task that declares its resources (``num_cpus``,
``num_gpus``); Ray places it on a node with room, so the cluster's size sets how many cells run at
once. The task runs the cell as a child process on that node and writes its log into the sweep
folder, which therefore must be on storage every node mounts; ``check_shared_storage`` proves that
before the first cell starts.

Nothing on the Ray path may hang or fill the terminal: ``check_address`` proves that ``--address``
answers as a gRPC server (a TCP connect within 3 s, then a reply to the HTTP/2 greeting within 10 s)
before Ray is asked to join it, since ``ray.init`` on a dead address, or on a port where something else
listens, retries for minutes; ``check_cell_fits`` refuses a cell larger than every node, which
Ray would queue for ever; and Ray's own log lines (its notices, the C++ core's connection retries)
go to ``<sweep>/logs/ray.log``, not to the terminal.
"""

from __future__ import annotations

import logging
import os
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from compress.core.errors import DataError, UsageError

BACKENDS = ("local", "ray")
RAY_INSTALL = "pip install 'compress[ray]'"
CONNECT_TIMEOUT_S = 3.0  # how long --address may take to accept a TCP connection
GREETING_TIMEOUT_S = 10.0  # then to answer the HTTP/2 greeting (a busy head node's GCS may be slow)
GCS_PORT, CLIENT_PORT = 6379, 10001  # Ray's default ports: HOST alone, ray://HOST alone


@dataclass(frozen=True)
class Ended:
    """A cell that stopped: its exit code, wall time and the host it ran on; ``reason`` when the
    cell's task died without an exit code (a lost node, a worker killed for memory)."""

    name: str
    returncode: int
    seconds: float
    host: str
    reason: str | None = None


def runner_prefix(runner: str | None) -> list[str]:
    """The command that runs one cell: ``--runner`` split like a shell would, or this Python's
    ``python -m compress`` (on a Ray node: that node's Python)."""
    return shlex.split(runner) if runner else [sys.executable, "-m", "compress"]


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    """Linux: the cell gets SIGTERM when the process that started it dies, so a killed driver (or
    Ray worker) leaves no orphaned training behind."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _popen(argv: list[str], log_path: Path, env: dict[str, str]) -> tuple[subprocess.Popen, Any]:
    fh = open(log_path, "w", encoding="utf-8")
    kwargs: dict[str, Any] = {"preexec_fn": _die_with_parent} if sys.platform.startswith("linux") else {}
    try:
        proc = subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT, env=env, **kwargs)
    except OSError as e:
        fh.close()
        raise UsageError(f"cannot start the cell runner '{argv[0]}' ({e.strerror}); check --runner") from None
    return proc, fh


class LocalBackend:
    """Cells as child processes of the driver, at most ``jobs`` at once, each with cores/jobs
    threads so N cells do not oversubscribe the machine."""

    name = "local"

    def __init__(self, jobs: int, runner: str | None):
        self.jobs = jobs
        self.prefix = runner_prefix(runner)
        self.env = dict(os.environ)
        if jobs > 1:
            threads = str(max(1, (os.cpu_count() or 1) // jobs))
            for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
                self.env.setdefault(var, threads)
        self.env.setdefault("COMPRESS_NO_PROGRESS", "1")
        self.running: dict[str, tuple[subprocess.Popen, float, Any]] = {}
        self.host = socket.gethostname()

    def describe(self) -> str:
        return f"{self.jobs} at a time"

    def prepare(self, sweep_dir: Path) -> None:
        """Nothing to check before the first cell: the cells run here."""

    def has_room(self) -> bool:
        return len(self.running) < self.jobs

    def start(self, name: str, argv: tuple[str, ...], log_path: Path) -> dict[str, Any]:
        proc, fh = _popen([*self.prefix, *argv], log_path, self.env)
        self.running[name] = (proc, time.time(), fh)
        return {"status": "running", "pid": proc.pid}

    def wait(self, timeout: float) -> list[Ended]:
        time.sleep(timeout)
        ended = []
        for name, (proc, t0, fh) in list(self.running.items()):
            rc = proc.poll()
            if rc is None:
                continue
            fh.close()
            del self.running[name]
            ended.append(Ended(name, rc, round(time.time() - t0, 1), self.host))
        return ended

    def stop(self) -> list[str]:
        """Stop every running cell (SIGTERM, then SIGKILL after 30 s); their names."""
        for proc, _, _ in self.running.values():
            proc.terminate()
        for proc, _, fh in self.running.values():
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
            fh.close()
        names = list(self.running)
        self.running.clear()
        return names

    def close(self) -> None:
        pass


# ----------------------------------------------------------------------------------------- Ray


def import_ray():
    try:
        import ray
    except ImportError:
        raise UsageError(f"--backend ray needs Ray, which is not installed; run: {RAY_INSTALL}") from None
    return ray


def cell_task(argv: list[str], runner: str | None, log_path: str,
                     env: dict[str, str]) -> tuple[int, float, str]:
    """The body of a cell's Ray task, run on whichever node Ray chose: the cell as a child process
    (the node's own ``python -m compress`` unless ``runner`` says otherwise), its output to
    ``log_path`` in the shared sweep folder. Returns (exit code, seconds, host)."""
    t0 = time.time()
    full_env = {**os.environ, **env}  # the worker's environment carries Ray's CUDA_VISIBLE_DEVICES
    proc, fh = _popen([*runner_prefix(runner), *argv], Path(log_path), full_env)
    try:
        rc = proc.wait()
    except BaseException:  # the task was cancelled: stop the cell with it
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        raise
    finally:
        fh.close()
    return rc, round(time.time() - t0, 1), socket.gethostname()


def read_token(path: str) -> tuple[str, str, str | None]:
    """Run on a node: (host, ip, the token file's text or None when the node cannot read it)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError:
        text = None
    try:
        ip = socket.gethostbyname(socket.gethostname())
    except OSError:
        ip = "?"
    return socket.gethostname(), ip, text


def write_token(path: Path, token: str) -> None:
    path.write_text(token, encoding="utf-8")


def check_shared_storage(ray, sweep_dir: Path) -> int:
    """Every alive node reads a token the driver wrote into ``sweep_dir``; a node that cannot is
    a one-line DataError naming it. Returns the number of nodes checked."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    token = uuid.uuid4().hex
    path = sweep_dir / f".storage-check-{token[:8]}"
    write_token(path, token)
    try:
        reader = ray.remote(num_cpus=0, max_retries=0)(read_token)
        nodes = [n for n in ray.nodes() if n.get("Alive")]
        refs = [reader.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False))
                .remote(str(path)) for n in nodes]
        for node, (host, ip, text) in zip(nodes, ray.get(refs, timeout=120)):
            if text != token:
                where = node.get("NodeManagerAddress", ip)
                raise DataError(f"Ray node {host} ({where}) cannot see the sweep folder {sweep_dir}; put "
                                "--out on storage every node mounts at the same path (e.g. NFS)")
    finally:
        path.unlink(missing_ok=True)
    return len(nodes)


def _host_port(text: str, default_port: int, shown: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[V6]:PORT``; the port may be left out) -> (host, port); a UsageError when
    the port is not a number."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit("//" + text)
        host, port = parts.hostname, parts.port
    except ValueError:
        host, port = None, None
    if not host:
        raise UsageError(f"{shown} is not HOST:PORT; pass e.g. head-node:6379, "
                         "ray://head-node:10001 or auto")
    return host, port or default_port


# RFC 9113 section 3.4: the client's connection preface, then an empty SETTINGS frame; a gRPC server
# (Ray's GCS and its Ray Client server both are) answers with a SETTINGS frame of its own
HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])
SETTINGS_FRAME = 4


def _connect(host: str, port: int, timeout: float, greeting_timeout: float) -> str | None:
    """None when a gRPC server answers at host:port (a TCP connect within ``timeout`` seconds, then
    its reply to the HTTP/2 greeting within ``greeting_timeout``), else why not, in a few words.
    With ``RAY_USE_TLS`` set the cluster expects a TLS handshake first, so the connect alone is
    checked."""
    try:
        conn = socket.create_connection((host, port), timeout=timeout)
    except socket.gaierror:
        return f"unknown host '{host}'"
    except ConnectionRefusedError:
        return "connection refused: nothing listens there"
    except TimeoutError:
        return f"no answer within {timeout:g} s"
    except OSError as e:
        return e.strerror or type(e).__name__
    with conn:
        if os.environ.get("RAY_USE_TLS", "").strip().lower() in ("1", "true"):
            return None
        head = _greet(conn, greeting_timeout)
    if head is None:
        return (f"something accepts connections there but is silent for {greeting_timeout:g} s: "
                "not Ray's gRPC port")
    # a frame header: 3 bytes length, type, flags, 4 bytes stream id; the server's own SETTINGS
    # (not an ACK of ours) on stream 0
    if len(head) == 9 and head[3] == SETTINGS_FRAME and not head[4] & 1 and not any(head[5:]):
        return None
    if not head:
        return "something accepts connections there but closed them unanswered: not Ray's gRPC port"
    return f"something there answered the HTTP/2 greeting with {head!r}: not Ray's gRPC port"


def _greet(conn: socket.socket, timeout: float) -> bytes | None:
    """The first 9 bytes (one frame header) a server sends back to the HTTP/2 preface; fewer when it
    closes the connection first; None when it stays silent for ``timeout`` seconds."""
    head, deadline = b"", time.monotonic() + timeout
    try:
        conn.sendall(HTTP2_PREFACE)
        while len(head) < 9:
            conn.settimeout(max(deadline - time.monotonic(), 0.001))
            chunk = conn.recv(9 - len(head))
            if not chunk:
                break
            head += chunk
    except TimeoutError:
        return None if not head else head
    except OSError:  # reset by the peer
        pass
    return head


def check_address(address: str | None, timeout: float = CONNECT_TIMEOUT_S,
                  greeting_timeout: float = GREETING_TIMEOUT_S) -> None:
    """Prove that ``--address`` answers before ``ray.init`` is asked to join it (it retries a dead
    address for minutes, printing as it goes). ``HOST:PORT``: a TCP connect to the GCS port and its
    gRPC (HTTP/2) greeting; ``ray://HOST:PORT``: the same at the Ray Client port; ``auto``: Ray's
    own discovery of a cluster running on this node (the latest ``ray start``), then its GCS port.
    ``RAY_ADDRESS`` overrides an unset or ``auto`` address, as it does for ``ray.init``. Unset
    (start Ray here): nothing to check. A dead address, or one where something other than Ray
    listens, is one UsageError line naming it and the fix."""
    env = os.environ.get("RAY_ADDRESS", "").strip()
    shown = f"--address {address}"
    if env and address in (None, "auto"):
        address, shown = env, f"RAY_ADDRESS={env}"
    if address is None or address == "local":
        return
    if address == "auto":
        from ray._private.services import get_ray_address_from_environment

        try:
            found = get_ray_address_from_environment("auto", None)
        except ConnectionError:
            found = None
        if not found or found == "auto":
            raise UsageError(f"{shown}: no Ray cluster is running on this node; start one with "
                             "'ray start --head', pass the cluster's HOST:6379, or leave --address unset "
                             "to start Ray for this sweep")
        host, port = _host_port(found, GCS_PORT, shown)
        fix = "start the cluster ('ray start --head') or pass its address"
    elif address.startswith("ray://"):
        host, port = _host_port(address[len("ray://"):], CLIENT_PORT, shown)
        fix = ("start the cluster with its Ray Client server ('ray start --head "
               f"--ray-client-server-port={port}') or check the address")
    elif "://" in address:
        raise UsageError(f"{shown}: unknown scheme; pass HOST:PORT, ray://HOST:PORT or auto")
    else:
        host, port = _host_port(address, GCS_PORT, shown)
        fix = f"start the cluster ('ray start --head --port={port}' on {host}) or check the address"
    why = _connect(host, port, timeout, greeting_timeout)
    if why is not None:
        raise UsageError(f"{shown}: no Ray cluster answers at {host}:{port} ({why}); {fix}")


def check_cell_fits(nodes: list[dict[str, Any]], cpus: float, gpus: float) -> None:
    """Refuse a cell that no alive node can hold: Ray would queue its task for ever. ``nodes`` is
    ``ray.nodes()``; the message names the request and the largest node's resources."""
    alive = [n for n in nodes if n.get("Alive")]
    have = [(float(n.get("Resources", {}).get("CPU", 0)), float(n.get("Resources", {}).get("GPU", 0)),
             n.get("NodeManagerAddress", "?")) for n in alive]
    if any(c >= cpus and g >= gpus for c, g, _ in have):
        return
    if not have:
        raise UsageError("the Ray cluster has no alive node; start one ('ray start') and re-run")
    # the node closest to fitting: most GPUs first when GPUs are asked for, else most CPUs
    c, g, where = max(have, key=(lambda h: (h[1], h[0])) if gpus > 0 else (lambda h: (h[0], h[1])))
    raise UsageError(f"--cpus-per-cell {cpus:g} --gpus-per-cell {gpus:g} is more than any node of the "
                     f"Ray cluster offers: the largest has {c:g} CPUs and {g:g} GPUs ({where}, "
                     f"{len(have)} node(s)); lower --cpus-per-cell/--gpus-per-cell or add a larger node")


class RayLogCapture:
    """Ray's own output while the driver talks to it: its Python loggers (``ray``) and whatever its
    C++ core writes to file descriptor 2 ("Failed to connect to GCS ...") go to a file rather than
    the terminal. First a temporary file (the sweep folder is not written before Ray has been
    reached and the cell checked), then ``<sweep>/logs/ray.log`` once ``move_to`` names it."""

    def __init__(self):
        self.file = tempfile.TemporaryFile(mode="w+b")
        self.path: Path | None = None
        self.saved_fd = os.dup(2)
        sys.stderr.flush()
        os.dup2(self.file.fileno(), 2)
        self.handler = logging.StreamHandler(open(os.dup(self.file.fileno()), "w", encoding="utf-8",
                                                  errors="replace", buffering=1))
        self.handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        self.logger = logging.getLogger("ray")
        self.old = (self.logger.handlers[:], self.logger.propagate)
        self.logger.handlers[:] = [self.handler]
        self.logger.propagate = False

    def move_to(self, path: Path) -> None:
        """Copy what was captured to ``path`` and go on appending there."""
        self.file.flush()
        self.file.seek(0)
        with open(path, "ab") as fh:
            fh.write(self.file.read())
        target = open(path, "ab", buffering=0)
        sys.stderr.flush()
        os.dup2(target.fileno(), 2)
        self.handler.setStream(open(os.dup(target.fileno()), "w", encoding="utf-8", errors="replace",
                                    buffering=1)).close()
        self.file.close()
        self.file, self.path = target, path

    def close(self) -> None:
        if self.saved_fd < 0:
            return
        sys.stderr.flush()
        os.dup2(self.saved_fd, 2)
        os.close(self.saved_fd)
        self.saved_fd = -1
        self.logger.handlers[:], self.logger.propagate = self.old
        self.handler.close()
        self.file.close()


class RayBackend:
    """Each cell a Ray task with ``cpus``/``gpus`` declared; Ray decides how many run at once.

    ``address`` None starts Ray on this machine; ``auto`` joins the running cluster; anything else
    is the cluster's address (``ray://host:10001`` or ``host:6379``). A Ray session already opened
    by the caller (``ray.init`` in a notebook) is used as it is and left open. The constructor
    reaches the cluster and checks that a cell fits a node, writing nothing; ``prepare`` checks the
    sweep folder from every node once it exists."""

    name = "ray"

    def __init__(self, runner: str | None, address: str | None, cpus: float, gpus: float):
        ray = import_ray()
        self.ray = ray
        self.owns_session = not ray.is_initialized()
        self.raised: BaseException | None = None  # by the caller's SIGTERM handler, see _init
        self.capture = RayLogCapture()
        try:
            if self.owns_session:
                self._init(address)
            check_cell_fits(ray.nodes(), cpus, gpus)
        except BaseException:
            self.close()
            raise
        self.nodes = 0
        self.runner = runner
        self.cpus, self.gpus = cpus, gpus
        threads = str(max(1, int(cpus)))
        self.env = {"COMPRESS_NO_PROGRESS": "1", "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads}
        self.task = ray.remote(num_cpus=cpus, num_gpus=gpus, max_retries=0)(cell_task)
        self.running: dict[Any, str] = {}  # object ref -> cell name

    def _init(self, address: str | None) -> None:
        # ray.init replaces the SIGTERM handler (with sys.exit, or, when it starts Ray here, one that
        # kills Ray's processes and exits 1): put the caller's back, so SIGTERM stops the sweep as
        # Ctrl-C does, which cancels the cells, records them and shuts Ray down.
        main = threading_is_main()
        previous = signal.getsignal(signal.SIGTERM) if main else None
        try:
            self.ray.init(address=address, include_dashboard=False, log_to_driver=False,
                          configure_logging=False)
        except (ConnectionError, RuntimeError, ValueError) as e:
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise UsageError(f"--address {address}: cannot reach a Ray cluster ({first}); start one "
                             "with 'ray start --head' or leave --address unset to run Ray here") from None
        finally:
            if main and callable(previous):
                signal.signal(signal.SIGTERM, self._remembering(previous))
            elif main and previous is not None:
                signal.signal(signal.SIGTERM, previous)

    def _remembering(self, handler):
        """``handler``, remembering the exception it raises: Ray turns any exception raised by a
        signal handler while it waits in C++ into a plain KeyboardInterrupt, which ``wait`` puts
        back (SIGTERM stays SIGTERM for the caller: exit 143, not 130)."""

        def on_signal(signum, frame):
            try:
                handler(signum, frame)
            except BaseException as exc:
                self.raised = exc
                raise

        return on_signal

    def prepare(self, sweep_dir: Path) -> None:
        """Ray's log into the sweep's logs (``logs/ray.log``), then the shared-storage check."""
        self.capture.move_to(sweep_dir / "logs" / "ray.log")
        self.nodes = check_shared_storage(self.ray, sweep_dir)

    def describe(self) -> str:
        total = self.ray.cluster_resources()
        return (f"Ray: {self.nodes} node(s), {total.get('CPU', 0):g} CPUs, {total.get('GPU', 0):g} GPUs; "
                f"{self.cpus:g} CPU(s) and {self.gpus:g} GPU(s) per cell")

    def has_room(self) -> bool:
        return True  # Ray queues the task until a node has the resources

    def start(self, name: str, argv: tuple[str, ...], log_path: Path) -> dict[str, Any]:
        ref = self.task.remote(list(argv), self.runner, str(log_path), self.env)
        self.running[ref] = name
        return {"status": "submitted"}

    def wait(self, timeout: float) -> list[Ended]:
        if not self.running:
            return []
        try:
            done, _ = self.ray.wait(list(self.running), num_returns=len(self.running), timeout=timeout)
        except KeyboardInterrupt as exc:
            if self.raised is not None and exc is not self.raised:
                raise self.raised from None
            raise
        ended = []
        for ref in done:
            name = self.running.pop(ref)
            try:
                rc, secs, host = self.ray.get(ref)
            except self.ray.exceptions.RayError as e:  # the task itself died (node lost, OOM-killed)
                first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
                ended.append(Ended(name, -1, 0.0, "?", f"the Ray task died: {first[:200]}"))
                continue
            ended.append(Ended(name, rc, secs, host))
        return ended

    def stop(self) -> list[str]:
        for ref in self.running:
            self.ray.cancel(ref, force=True)
        names = list(self.running.values())
        self.running.clear()
        return names

    def close(self) -> None:
        try:
            if self.owns_session and self.ray.is_initialized():
                self.ray.shutdown()
        finally:
            self.capture.close()


def threading_is_main() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


def make_backend(backend: str, jobs: int, runner: str | None, address: str | None, cpus: float,
                 gpus: float):
    """The backend, ready to start cells once ``prepare(sweep_dir)`` has run; writes nothing."""
    if backend == "local":
        return LocalBackend(jobs, runner)
    if backend == "ray":
        return RayBackend(runner, address, cpus, gpus)
    raise UsageError(f"unknown backend '{backend}'; choose one of: {', '.join(BACKENDS)}")
