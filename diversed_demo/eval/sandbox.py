"""The sandbox generated code runs in: bubblewrap (an empty root holding only /usr, a private /tmp and the
program's folder; no network; its own PID namespace, killed with its parent; no environment), as the
unprivileged user nobody, under limits on memory, CPU time, file size and process count.

Where that cannot be set up, code is refused with a message saying why: it never runs unisolated.
"""

from __future__ import annotations

import functools
import math
import os
import shutil
import signal
import subprocess
import tempfile
from dataclasses import dataclass

SANDBOX_TIMEOUT_S = 10.0
SANDBOX_MEMORY_MB = 1024
SANDBOX_OUTPUT_MB = 16  # largest file the program may write (its stderr included)
SANDBOX_PROCESSES = 64  # processes and threads the sandbox's user may run at once
NOBODY = 65534  # the unprivileged user the program runs as (RLIMIT_NPROC binds no root process)
PYTHON = "/usr/bin/python3"  # the system's interpreter: the sandbox's root holds /usr and nothing else
ISOLATION = (
    "no network",
    "own PID namespace, killed with its parent",
    "root: /usr read-only, private /tmp, the program's folder",
    "no environment",
    f"user nobody ({NOBODY})",
    "limits: memory, CPU time, file size, processes",
)
INSTALL_HINT = "install bubblewrap (Debian: apt-get install bubblewrap; `make test` does)"

# The sandboxed interpreter's own code (`python -I -c`): limits set here bind the program and every process
# it starts. The program then runs as __main__ from its own file, so `from __future__` imports and
# traceback line numbers work as written.
SANDBOX_LAUNCHER = """\
import resource, runpy
resource.setrlimit(resource.RLIMIT_AS, ({memory_bytes}, {memory_bytes}))
resource.setrlimit(resource.RLIMIT_CPU, ({cpu_seconds}, {cpu_seconds}))
resource.setrlimit(resource.RLIMIT_FSIZE, ({file_bytes}, {file_bytes}))
resource.setrlimit(resource.RLIMIT_NPROC, ({processes}, {processes}))
runpy.run_path("program.py", run_name="__main__")
"""


@dataclass
class SandboxResult:
    passed: bool
    status: str  # "passed", "failed", "timeout", or "refused" where no isolation could be set up
    detail: str  # the end of stderr, or what stopped the program
    isolation: tuple[str, ...] = ISOLATION  # what was blocked around the program (none where refused)


def isolation_command(workdir: str) -> list[str]:
    """bubblewrap's command for a program in `workdir`, dropping to nobody first where we are root."""
    bwrap = shutil.which("bwrap")
    if bwrap is None or not os.path.exists(PYTHON):
        raise OSError(f"no bubblewrap or no {PYTHON}: {INSTALL_HINT}")
    drop = []
    if os.geteuid() == 0:
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            raise OSError("setpriv (util-linux) is needed to run code as nobody")
        drop = [setpriv, f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--inh-caps=-all"]
    root = ["--ro-bind", "/usr", "/usr", "--symlink", "usr/bin", "/bin", "--symlink", "usr/lib", "/lib"]
    root += ["--symlink", "usr/lib64", "/lib64", "--tmpfs", "/tmp", "--proc", "/proc", "--dev", "/dev"]
    return [
        *drop,
        bwrap,
        *root,
        *["--bind", workdir, "/sandbox", "--chdir", "/sandbox"],
        *["--unshare-all", "--die-with-parent", "--new-session", "--clearenv"],
        PYTHON,
    ]


@functools.lru_cache(maxsize=1)
def isolation_problem() -> str | None:
    """Why code cannot run isolated here (probed once), or None where it can."""
    try:
        with tempfile.TemporaryDirectory(prefix="diversed-sandbox-") as workdir:
            os.chmod(workdir, 0o777)
            probe = subprocess.run(
                [*isolation_command(workdir), "-I", "-c", "pass"],
                capture_output=True,
                text=True,
                timeout=30,
            )
    except (OSError, subprocess.TimeoutExpired) as err:
        return str(err)
    if probe.returncode != 0:
        return f"bubblewrap could not start ({probe.stderr.strip()[-300:]}); {INSTALL_HINT}"
    return None


def run_sandboxed(
    program: str, timeout_s: float = SANDBOX_TIMEOUT_S, memory_mb: int = SANDBOX_MEMORY_MB
) -> SandboxResult:
    """Run a Python program isolated (see the module's docstring); it passes if it exits with status 0.
    Its folder is deleted afterwards, and a timeout kills everything it started."""
    problem = isolation_problem()
    if problem is not None:
        return SandboxResult(False, "refused", f"code is never run without isolation: {problem}", ())
    launcher = SANDBOX_LAUNCHER.format(
        memory_bytes=memory_mb * 2**20,
        cpu_seconds=math.ceil(timeout_s) + 1,
        file_bytes=SANDBOX_OUTPUT_MB * 2**20,
        processes=SANDBOX_PROCESSES,
    )
    with tempfile.TemporaryDirectory(prefix="diversed-sandbox-") as workdir:
        os.chmod(workdir, 0o777)  # nobody writes here; the folder is private to this call and deleted
        with open(os.path.join(workdir, "program.py"), "w", encoding="utf-8") as f:
            f.write(program)
        with tempfile.TemporaryFile() as stderr:
            returncode, timed_out = run_process(
                [*isolation_command(workdir), "-I", "-c", launcher], stderr, timeout_s
            )
            stderr.seek(max(0, stderr.seek(0, os.SEEK_END) - 2000))  # the last 2000 bytes
            tail = stderr.read().decode("utf-8", "replace").strip()
    if timed_out:
        return SandboxResult(False, "timeout", f"stopped after {timeout_s:g} s")
    if returncode == 0:
        return SandboxResult(True, "passed", tail)
    if returncode < 0:
        tail = f"killed by {signal.Signals(-returncode).name}\n{tail}".strip()
    return SandboxResult(False, "failed", tail)


def run_process(command: list[str], stderr, timeout_s: float) -> tuple[int, bool]:
    """(exit status, whether the timeout stopped it); its whole process group is killed at the end."""
    process = subprocess.Popen(
        command,
        env={},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=stderr,
        start_new_session=True,
    )
    try:
        process.wait(timeout=timeout_s)
        timed_out = False
    except subprocess.TimeoutExpired:
        timed_out = True
    finally:
        _kill_group(process)
    return process.returncode, timed_out


def _kill_group(process: subprocess.Popen) -> None:
    """Kill the program and every process it started (they share its session's process group)."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait()
