"""The kernel nbgrader starts for each graded notebook: an IPython kernel in a sandbox, when the machine allows one.

``course_tools.grading`` installs a kernel spec (``course-grading``) whose command is::

    python -m course_tools.grading_kernel -f {connection_file} [nbgrader's extra kernel arguments]

Before it becomes the kernel (``exec``), this wrapper makes a fresh folder under ``$COURSE_GRADING_SCRATCH``
(outside nbgrader's course folder) and makes it the kernel's working folder, ``HOME`` and ``TMPDIR``. With
``COURSE_GRADING_SANDBOX=1`` (the grader sets it where :func:`sandbox_works`), on Linux as root, it also:

* enters a mount namespace of its own (what the kernel, the lab's check and every rank see; nothing else does);
* mounts a size-limited tmpfs (``$COURSE_GRADING_DISK_BYTES``) on that folder, and another on ``/dev/shm``: a full
  disk is that tmpfs, nothing else;
* covers each path of ``$COURSE_GRADING_HIDE`` (the course folder: gradebook and sources; the solutions; the tests)
  with an empty read-only tmpfs: they are not there for the student's code;
* makes every other mount read-only (``/proc``, ``/sys`` and ``/dev`` aside), so the notebook writes only in its folder;
* gives up every capability and sets ``no_new_privs``: the student's code, though it runs as root, cannot undo any
  of this (unmount, remount, setuid programs).

Without the sandbox (not root, not Linux, or mounts refused), only the working folder changes: the kernel can read
whatever the grader's user can. ``grading.py`` prints which of the two it uses, and the guide says what that means.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import shutil
import sys
import tempfile

CLONE_NEWNS = 0x00020000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
PR_SET_NO_NEW_PRIVS, PR_CAPBSET_DROP = 38, 24
_KEEP_WRITABLE = ("/proc", "/sys", "/dev")


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def _call(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def _mount(libc: ctypes.CDLL, source: str | None, target: str, fstype: str | None, flags: int, data: str = "") -> None:
    encode = lambda s: s.encode() if s is not None else None  # noqa: E731
    _call(libc.mount(encode(source), target.encode(), encode(fstype), flags, data.encode() or None), f"mount {target}")


def _mount_points() -> list[tuple[str, set[str]]]:
    """Every mount point this process sees, with its per-mount flags (``/proc/self/mountinfo``), deepest last."""
    points = []
    with open("/proc/self/mountinfo", encoding="utf-8") as f:
        for line in f:
            fields = line.split()
            path = fields[4].encode().decode("unicode_escape")
            points.append((path, set(fields[5].split(","))))
    return points


def _flags(options: set[str]) -> int:
    names = {"nosuid": MS_NOSUID, "nodev": MS_NODEV, "noexec": MS_NOEXEC}
    return sum(flag for name, flag in names.items() if name in options)


def _drop_capabilities(libc: ctypes.CDLL) -> None:
    _call(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    for cap in range(64):
        if libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 and ctypes.get_errno() != 22:  # EINVAL: past the last cap
            _call(-1, f"drop capability {cap}")

    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]

    header, data = Header(0x20080522, 0), (Data * 2)()  # _LINUX_CAPABILITY_VERSION_3, all sets empty
    _call(libc.capset(ctypes.byref(header), data), "capset")


def enter_sandbox(work: str, disk_bytes: int, hide: list[str]) -> None:
    """This process (and what it starts) in the sandbox described in the module's docstring, working in ``work``."""
    libc = _libc()
    _call(libc.unshare(CLONE_NEWNS), "unshare")
    _mount(libc, None, "/", None, MS_REC | MS_PRIVATE)
    _mount(libc, "tmpfs", work, "tmpfs", MS_NOSUID | MS_NODEV, f"size={disk_bytes},mode=0700")
    if os.path.isdir("/dev/shm"):
        _mount(libc, "tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, f"size={min(disk_bytes, 256 << 20)}")
    for path in hide:
        if os.path.isdir(path):
            _mount(libc, "tmpfs", path, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV, "size=4k,mode=0")
    keep = {work, "/dev/shm", *hide}
    for point, options in _mount_points():
        if point in keep or point.startswith(_KEEP_WRITABLE) or "ro" in options:
            continue
        try:
            _mount(libc, None, point, None, MS_REMOUNT | MS_BIND | MS_RDONLY | _flags(options))
        except OSError:
            if point == "/":
                raise
    _drop_capabilities(libc)


def sandbox_works() -> bool:
    """Whether :func:`enter_sandbox` works here, tried in a child process that checks a hidden file is gone."""
    if sys.platform != "linux" or os.geteuid() != 0:
        return False
    with tempfile.TemporaryDirectory() as root:
        secret, work = os.path.join(root, "secret"), os.path.join(root, "work")
        os.makedirs(secret)
        os.makedirs(work)
        with open(os.path.join(secret, "answer"), "w") as f:
            f.write("42")
        pid = os.fork()
        if pid == 0:  # the child: sandbox itself, then try what a student's code would
            code = 1
            try:
                enter_sandbox(work, 1 << 20, [secret])
                hidden = not os.path.exists(os.path.join(secret, "answer"))
                try:
                    open(os.path.join(root, "outside"), "w").close()
                    read_only = False
                except OSError:
                    read_only = True
                code = 0 if hidden and read_only else 1
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        return os.waitstatus_to_exitcode(status) == 0


def main(argv: list[str]) -> int:
    if "-f" not in argv[:-1]:
        print("usage: python -m course_tools.grading_kernel -f CONNECTION_FILE [kernel arguments]", file=sys.stderr)
        return 2
    at = argv.index("-f")
    connection, rest = argv[at + 1], argv[:at] + argv[at + 2 :]
    scratch_root = os.environ.get("COURSE_GRADING_SCRATCH") or tempfile.gettempdir()
    work = tempfile.mkdtemp(prefix="kernel-", dir=scratch_root)
    settings = open(connection, encoding="utf-8").read()  # before the sandbox: nbgrader's runtime folder may be hidden
    if os.environ.get("COURSE_GRADING_SANDBOX") == "1":
        hide = [p for p in os.environ.get("COURSE_GRADING_HIDE", "").split(os.pathsep) if p]
        enter_sandbox(work, int(os.environ.get("COURSE_GRADING_DISK_BYTES", str(512 << 20))), hide)
    copy = os.path.join(work, ".connection.json")
    with open(copy, "w", encoding="utf-8") as f:
        f.write(settings)
    env = dict(os.environ)
    env.update(HOME=work, TMPDIR=work, MPLCONFIGDIR=os.path.join(work, ".matplotlib"))
    env.update(IPYTHONDIR=os.path.join(work, ".ipython"), JUPYTER_RUNTIME_DIR=os.path.join(work, ".jupyter"))
    for name in ("COURSE_GRADING_HIDE", "COURSE_GRADING_SANDBOX"):
        env.pop(name, None)
    os.chdir(work)
    shutil.rmtree(os.path.join(work, ".ipython"), ignore_errors=True)
    os.execve(sys.executable, [sys.executable, "-m", "ipykernel_launcher", "-f", copy, *rest], env)
    return 1  # not reached: execve replaces this process


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
