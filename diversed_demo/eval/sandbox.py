"""The sandbox generated code runs in: a separate, limited Python interpreter (memory, CPU time, file size,
no sockets, no network where a namespace can be made) with a timeout; not a security boundary."""

from __future__ import annotations

import functools
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass

SANDBOX_TIMEOUT_S = 10.0
SANDBOX_MEMORY_MB = 1024
SANDBOX_OUTPUT_MB = 16  # largest file the program may write (its stderr included)


# The sandboxed interpreter's own code (`python -I -c`): limits set here bind the program and any process
# it starts; socket.socket is replaced so that making any socket fails (the network namespace, when
# available, also covers what this cannot, e.g. ctypes or a spawned binary). The program then runs as
# __main__ from its own file, so `from __future__` imports and traceback line numbers work as written.
SANDBOX_LAUNCHER = """\
import resource, runpy, socket, _socket
resource.setrlimit(resource.RLIMIT_AS, ({memory_bytes}, {memory_bytes}))
resource.setrlimit(resource.RLIMIT_CPU, ({cpu_seconds}, {cpu_seconds}))
resource.setrlimit(resource.RLIMIT_FSIZE, ({file_bytes}, {file_bytes}))

def refuse(kind):
    class NoNetwork(kind):
        def __init__(self, *args, **kwargs):
            raise PermissionError("network access is disabled in the sandbox")
    return NoNetwork

socket.socket = socket.SocketType = refuse(socket.socket)
_socket.socket = _socket.SocketType = refuse(_socket.socket)
runpy.run_path("program.py", run_name="__main__")
"""


@dataclass
class SandboxResult:
    passed: bool
    status: str  # "passed", "failed" or "timeout"
    detail: str  # the end of stderr, or what stopped the program


@functools.lru_cache(maxsize=1)
def network_namespace_command() -> tuple[str, ...]:
    """`unshare --net --map-root-user` if this machine lets us make a network namespace, else ().

    In a fresh network namespace there is no interface but a downed loopback: nothing the program or
    its children do can reach any network. Containers often forbid user namespaces, hence the probe.
    """
    unshare = shutil.which("unshare")
    if unshare is None:
        return ()
    command = (unshare, "--net", "--map-root-user")
    try:
        probe = subprocess.run(
            [*command, sys.executable, "-I", "-c", "pass"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env={},
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired):
        return ()
    return command if probe.returncode == 0 else ()


def run_sandboxed(
    program: str,
    timeout_s: float = SANDBOX_TIMEOUT_S,
    memory_mb: int = SANDBOX_MEMORY_MB,
    isolate_network: bool = True,
) -> SandboxResult:
    """Run a Python program in a separate, limited interpreter; it passes if it exits with status 0.

    The program runs as `python -I` (no environment variables, no user site) with an empty
    environment, in a fresh temporary directory that is deleted afterwards, under limits on address
    space (memory_mb), CPU time and file size, in its own process group that is killed at the end
    (so a timeout also stops anything it started), and with sockets disabled. With
    `isolate_network` and a working `unshare`, it also runs in an empty network namespace.
    It is not a security boundary: the program can read and write whatever the user can.
    """
    launcher = SANDBOX_LAUNCHER.format(
        memory_bytes=memory_mb * 2**20,
        cpu_seconds=math.ceil(timeout_s) + 1,
        file_bytes=SANDBOX_OUTPUT_MB * 2**20,
    )
    namespace = network_namespace_command() if isolate_network else ()
    with tempfile.TemporaryDirectory(prefix="diversed-sandbox-") as workdir:
        with open(os.path.join(workdir, "program.py"), "w", encoding="utf-8") as f:
            f.write(program)
        with open(os.path.join(workdir, "stderr.txt"), "w+b") as stderr:
            process = subprocess.Popen(
                [*namespace, sys.executable, "-I", "-c", launcher],
                cwd=workdir,
                env={},
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=stderr,
                start_new_session=True,
            )
            timed_out = False
            try:
                process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                timed_out = True
            finally:
                _kill_group(process)
            stderr.seek(max(0, stderr.seek(0, os.SEEK_END) - 2000))  # the last 2000 bytes
            tail = stderr.read().decode("utf-8", "replace").strip()
    if timed_out:
        return SandboxResult(False, "timeout", f"stopped after {timeout_s:g} s")
    if process.returncode == 0:
        return SandboxResult(True, "passed", tail)
    if process.returncode < 0:
        tail = f"killed by {signal.Signals(-process.returncode).name}\n{tail}".strip()
    return SandboxResult(False, "failed", tail)


def _kill_group(process: subprocess.Popen) -> None:
    """Kill the program and every process it started (they share its session's process group)."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait()
