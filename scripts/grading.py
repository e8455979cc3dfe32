"""Grade the labs of a folder of submissions with nbgrader: scores in nbgrader's gradebook, a CSV, feedback per student.

    python -m course_tools.grading SUBMISSIONS [--course _editions/instructor/nbgrader] [--out _grading]
                                   [--lab-timeout 120] [--cell-timeout 60] [--disk-mb 512]     # make grade

``SUBMISSIONS`` holds one folder per student, with the lab notebooks they handed in, either as nbgrader collects them
(``<student>/<lab>/<lab>.ipynb``) or flat (``<student>/<lab>.ipynb``).

For each student and each lab, ``nbgrader autograde`` runs the notebook in a fresh kernel; the lab's graded cell runs
the lab's check in a fresh ``python -I`` process (:func:`course_lib.labs.grading.grade_lab`). Around each run:

* **time**: the graded cell may take ``--lab-timeout`` per launch of the lab's job (plus a minute), any other cell
  ``--cell-timeout``; a cell past its limit fails the notebook (no interrupt and carry on), and the whole run has a
  wall-clock limit;
* **disk**: no file larger than ``--disk-mb`` (``RLIMIT_FSIZE``), and the kernel's scratch folder is watched: past
  ``--disk-mb`` in all, the run is stopped;
* **processes**: every process of the run inherits a marker (``COURSE_GRADING_TOKEN``); once the run has ended, any
  process still carrying it is named in the feedback and killed, and the lab scores 0;
* **isolation**: the kernel runs in a private folder outside nbgrader's course folder and, where the machine allows
  it (Linux, as root), in a sandbox (``course_tools.grading_kernel``): the course folder (sources, gradebook), the
  solutions and the tests are covered by empty mounts, everything else is read-only, the folder is a tmpfs of
  ``--disk-mb``, and the kernel holds no capability to undo it.

A run that fails (a kernel that dies, a cell past its limit, the disk, a process left behind) scores 0 for that lab
in the gradebook, with the reason; the other labs and students are graded as usual. Then ``nbgrader export`` writes
``grades.csv`` and ``nbgrader generate_feedback`` the HTML feedback, and ``feedback/<student>.md`` gathers each lab's
score, its check's messages and any reason it scored 0.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from course_lib.manifest import ROOT
from course_tools.classroom import CHECK_ID, COURSE_ID, EDITIONS, POINTS, nbgrader, tool_env
from course_tools.grading_kernel import sandbox_works

KERNEL_NAME = "course-grading"
TOKEN_ENV = "COURSE_GRADING_TOKEN"
GRADING_CONFIG = """
# -- added by course_tools.grading: limits for grading untrusted notebooks ------------------------------------------
def _cell_timeout(cell):
    graded = cell.get("metadata", {{}}).get("nbgrader", {{}}).get("grade", False)
    return {graded:d} if graded else {other:d}


c.Execute.timeout_func = _cell_timeout
c.Execute.interrupt_on_timeout = False
c.Execute.kernel_name = "{kernel}"
c.Execute.allow_errors = True
"""


@dataclass
class LabGrade:
    """One student's grade for one lab: the points, and what the feedback says."""

    student: str
    lab: str
    score: float = 0.0
    reason: str = ""  # why it scored 0 when the check was not the reason (no submission, a hang, a crash...)
    messages: list[str] = field(default_factory=list)  # the graded cell's printed verdict and error
    seconds: float = 0.0


def collect(submissions: Path, labs: list[str]) -> dict[str, dict[str, Path]]:
    """``{student: {lab: notebook}}`` from a submissions folder, nbgrader's layout or flat."""
    if not submissions.is_dir():
        raise FileNotFoundError(f"no submissions folder {submissions}")
    found: dict[str, dict[str, Path]] = {}
    for student in sorted(p for p in submissions.iterdir() if p.is_dir() and not p.name.startswith(".")):
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", student.name):
            raise ValueError(f"student folder {student.name!r}: use letters, digits, '.', '_' or '-'")
        found[student.name] = {}
        for lab in labs:
            for candidate in (student / lab / f"{lab}.ipynb", student / f"{lab}.ipynb"):
                if candidate.is_file():
                    found[student.name][lab] = candidate
                    break
    return found


def _processes_with(token: str) -> list[tuple[int, str]]:
    """Every process (but this one) whose environment carries the run's marker: (pid, command line)."""
    needle = f"{TOKEN_ENV}={token}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle in (entry / "environ").read_bytes().split(b"\0"):
                command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
                found.append((int(entry.name), command[:120]))
        except OSError:  # gone, or not ours to read
            continue
    return found


def sweep(token: str, grace: float = 5.0) -> list[str]:
    """Wait up to ``grace`` s for the run's processes to end on their own, then kill the rest; the ones killed."""
    deadline = time.monotonic() + grace
    while (left := _processes_with(token)) and time.monotonic() < deadline:
        time.sleep(0.2)
    killed = [f"pid {pid}: {command}" for pid, command in left]
    for _ in range(50):
        if not left:
            break
        for pid, _ in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.1)
        left = _processes_with(token)
    if left:
        raise RuntimeError(f"processes of a graded run survive SIGKILL: {left}")
    return killed


def _folder_bytes(root: Path) -> int:
    total = 0
    for folder, _, files in os.walk(root):
        for name in files:
            try:
                total += os.lstat(os.path.join(folder, name)).st_size
            except OSError:
                continue
    return total


def _disk_used(token: str, scratch: Path) -> int:
    """The bytes in use on the tmpfs folders (under ``scratch``) that the run's sandboxed processes work in."""
    used = 0
    for pid, _ in _processes_with(token):
        try:
            if not os.readlink(f"/proc/{pid}/cwd").startswith(str(scratch)):
                continue  # nbgrader itself, in the course folder
            st = os.statvfs(f"/proc/{pid}/cwd")
        except OSError:
            continue
        used = max(used, (st.f_blocks - st.f_bfree) * st.f_frsize)
    return used


class Grader:
    """Grades submissions into one nbgrader course folder (``out/nbgrader``), one lab run at a time."""

    def __init__(self, course: Path, out: Path, lab_timeout: float, cell_timeout: float, disk_mb: int) -> None:
        self.out, self.lab_timeout, self.cell_timeout, self.disk_bytes = out, lab_timeout, cell_timeout, disk_mb << 20
        self.course = out / "nbgrader"
        self.course.mkdir(parents=True, exist_ok=True)
        os.chmod(self.course, 0o700)  # the gradebook, the sources: closed to the kernel's user
        for name in ("nbgrader_config.py", "gradebook.db"):
            if not (self.course / name).exists():
                shutil.copy2(course / name, self.course / name)
        if not (self.course / "source").exists():
            shutil.copytree(course / "source", self.course / "source")
        self.labs = sorted(p.name for p in (self.course / "source").iterdir() if p.is_dir())
        self.sandbox = sandbox_works()
        hidden = [self.course, course, course.parent / "solutions", ROOT / "solutions", ROOT / "tests", ROOT / "docs"]
        self.hide = [str(p) for p in dict.fromkeys(p.resolve() for p in hidden) if p.is_dir()]
        self.scratch = Path(tempfile.mkdtemp(prefix="course-grading-"))
        os.chmod(self.scratch, 0o711)  # the kernel's user may enter it, not list it
        self.kernels = self.scratch / "jupyter"
        spec = {
            "argv": [sys.executable, "-m", "course_tools.grading_kernel", "-f", "{connection_file}"],
            "display_name": "Python 3 (course grading)",
            "language": "python",
        }
        (self.kernels / "kernels" / KERNEL_NAME).mkdir(parents=True)
        (self.kernels / "kernels" / KERNEL_NAME / "kernel.json").write_text(json.dumps(spec), encoding="utf-8")
        graded = int(lab_timeout * 3 + 90)  # the capstone launches 3 jobs
        config = (self.course / "nbgrader_config.py").read_text(encoding="utf-8").split("\n# -- added by")[0]
        config += GRADING_CONFIG.format(graded=graded, other=int(cell_timeout), kernel=KERNEL_NAME)
        (self.course / "nbgrader_config.py").write_text(config, encoding="utf-8")
        self.wall = graded + 20 * cell_timeout + 120

    def _disk_full(self, token: str) -> bool:
        """Whether the run has (nearly) filled the disk it may use: its tmpfs in the sandbox, its folder without."""
        if self.sandbox:
            return _disk_used(token, self.scratch) >= 0.9 * self.disk_bytes
        return _folder_bytes(self.scratch) > self.disk_bytes

    def close(self) -> None:
        shutil.rmtree(self.scratch, ignore_errors=True)

    def _limits(self) -> None:  # in the nbgrader process, before exec: inherited by the kernel and the ranks
        os.setsid()
        import resource

        resource.setrlimit(resource.RLIMIT_FSIZE, (self.disk_bytes, self.disk_bytes))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

    def run_autograde(self, student: str, lab: str) -> tuple[int | None, str, str, list[str]]:
        """nbgrader autograde, watched: (exit code or None if stopped, its log, why it was stopped, leftovers)."""
        token = uuid.uuid4().hex
        env = tool_env()
        env.update({TOKEN_ENV: token, "COURSE_GRADING_SCRATCH": str(self.scratch), "JUPYTER_PATH": str(self.kernels)})
        env["COURSE_LAB_TIMEOUT"] = f"{self.lab_timeout:g}"
        env.pop("COURSE_LIB_STRICT_TEARDOWN", None)  # a student's teardown warns, as in their own JupyterLab
        env["COURSE_GRADING_DISK_BYTES"] = str(self.disk_bytes)
        if self.sandbox:
            env.update(COURSE_GRADING_SANDBOX="1", COURSE_GRADING_HIDE=os.pathsep.join(self.hide))
        command = [sys.executable, "-m", "nbgrader", "autograde", lab, "--student", student, "--force"]
        log = tempfile.TemporaryFile(mode="w+")
        process = subprocess.Popen(
            command, cwd=self.course, env=env, stdout=log, stderr=subprocess.STDOUT, preexec_fn=self._limits
        )
        stopped = ""
        start = time.monotonic()
        while process.poll() is None:
            if time.monotonic() - start > self.wall:
                stopped = f"the notebook ran past the grader's limit of {self.wall:.0f} s"
            elif self._disk_full(token):
                stopped = f"the notebook wrote more than {self.disk_bytes >> 20} MiB to disk"
            if stopped:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
                break
            time.sleep(0.25)
        leftovers = sweep(token)
        for child in self.scratch.glob("kernel-*"):
            shutil.rmtree(child, ignore_errors=True)
        log.seek(0)
        return (None if stopped else process.returncode), log.read(), stopped, leftovers

    def grade(self, student: str, lab: str, notebook: Path | None) -> LabGrade:
        start = time.monotonic()
        result = LabGrade(student, lab)
        target = self.course / "submitted" / student / lab
        if target.exists():
            shutil.rmtree(target)
        if notebook is None:
            result.reason = "no submission"  # nbgrader's export counts it as 0
            return result
        target.mkdir(parents=True)
        shutil.copy2(notebook, target / f"{lab}.ipynb")
        code, log, stopped, leftovers = self.run_autograde(student, lab)
        graded = self.course / "autograded" / student / lab / f"{lab}.ipynb"
        if graded.is_file():
            result.messages = graded_cell_messages(graded)
        if stopped:
            result.reason = stopped
        elif code != 0 or not graded.is_file():
            result.reason = failure_reason(log)
        elif leftovers:
            result.reason = f"{len(leftovers)} process(es) left running after the notebook ended: " + "; ".join(
                leftovers
            )
        if result.reason:
            self._set_zero(student, lab, create=True)
        else:
            result.score = self._score(student, lab)
        result.seconds = time.monotonic() - start
        return result

    def _gradebook(self):  # noqa: ANN202 (nbgrader's Gradebook, untyped)
        from nbgrader.api import Gradebook

        return Gradebook(f"sqlite:///{self.course / 'gradebook.db'}", COURSE_ID)

    def _score(self, student: str, lab: str) -> float:
        with self._gradebook() as gb:
            return float(gb.find_submission(lab, student).score)

    def _set_zero(self, student: str, lab: str, create: bool) -> None:
        """Score 0 for every graded cell of the student's lab notebook (the submission is created if need be)."""
        import warnings

        from nbgrader.api import MissingEntry

        with warnings.catch_warnings(), self._gradebook() as gb:
            warnings.simplefilter("ignore")  # SQLAlchemy's notes about nbgrader's session use
            gb.update_or_create_student(student)
            try:
                submission = gb.find_submission(lab, student)
            except MissingEntry:
                if not create:
                    return
                submission = gb.add_submission(lab, student)
            for notebook in submission.notebooks:
                for grade in notebook.grades:
                    grade.auto_score = 0
                    grade.manual_score = None
                    grade.needs_manual_grade = False
            gb.db.commit()


def graded_cell_messages(path: Path) -> list[str]:
    """What the graded cell printed (the check's verdict) and the error it raised, as lines of text."""
    notebook = nbformat.read(path, as_version=4)
    lines: list[str] = []
    for cell in notebook.cells:
        if cell.get("metadata", {}).get("nbgrader", {}).get("grade_id") != CHECK_ID:
            continue
        for output in cell.get("outputs", []):
            if output.get("output_type") == "stream":
                lines += [ln for ln in output.get("text", "").splitlines() if ln.strip()]
            elif output.get("output_type") == "error":
                lines.append(f"{output.get('ename')}: {output.get('evalue')}")
    return lines


def failure_reason(log: str) -> str:
    """Why nbgrader could not grade a notebook, from its log, in one line."""
    if "DeadKernelError" in log or "Kernel died" in log:
        return "the notebook's kernel died while it ran (killed, or crashed)"
    if "CellTimeoutError" in log or "TimeoutError" in log or "timed out" in log.lower():
        return "a cell ran past its time limit (the notebook hangs)"
    if "File too large" in log or "EFBIG" in log:
        return "the notebook wrote a file larger than the grader allows"
    last = [ln for ln in log.strip().splitlines() if ln.strip()][-1:] or ["no log"]
    return f"nbgrader could not grade the notebook: {last[0][:200]}"


def feedback_markdown(student: str, grades: list[LabGrade]) -> str:
    total = sum(g.score for g in grades)
    lines = [f"# Feedback for {student}", "", f"Total: {total:g} / {POINTS * len(grades)} points", ""]
    for g in grades:
        lines += [f"## {g.lab}: {g.score:g} / {POINTS}", ""]
        if g.reason:
            lines += [f"Scored 0: {g.reason}.", ""]
        if g.messages:
            lines += ["The lab's check said:", "", "```", *g.messages, "```", ""]
    return "\n".join(lines)


def grade_all(submissions: Path, course: Path, out: Path, **limits: float) -> list[LabGrade]:
    out.mkdir(parents=True, exist_ok=True)
    grader = Grader(course, out, **limits)  # type: ignore[arg-type]
    try:
        found = collect(submissions, grader.labs)
        grades: list[LabGrade] = []
        isolation = (
            "each kernel in a sandbox: the course folder, solutions and tests hidden, the rest read-only"
            if grader.sandbox
            else "no sandbox on this machine: the kernels can read what the grader's user can"
        )
        print(f"grading {len(found)} students x {len(grader.labs)} labs ({isolation})", flush=True)
        for student, notebooks in found.items():
            for lab in grader.labs:
                g = grader.grade(student, lab, notebooks.get(lab))
                grades.append(g)
                if lab in notebooks:  # the labs not handed in score 0 without a line here (the feedback says so)
                    why = f" ({g.reason})" if g.reason else ""
                    print(f"  {student:16s} {lab:24s} {g.score:4g} / {POINTS}  ~{g.seconds:.0f} s{why}", flush=True)
            for lab in grader.labs:
                if (grader.course / "autograded" / student / lab).is_dir():
                    nbgrader(grader.course, "generate_feedback", lab, "--student", student, "--force", timeout=600)
        feedback = out / "feedback"
        feedback.mkdir(exist_ok=True)
        for student in found:
            text = feedback_markdown(student, [g for g in grades if g.student == student])
            (feedback / f"{student}.md").write_text(text, encoding="utf-8")
        nbgrader(grader.course, "export", "--to", str(out / "grades.csv"))
    finally:
        grader.close()
    return grades


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("submissions", type=Path)
    parser.add_argument("--course", type=Path, default=EDITIONS / "instructor" / "nbgrader")
    parser.add_argument("--out", type=Path, default=Path("_grading"))
    parser.add_argument("--lab-timeout", type=float, default=120.0, help="seconds per launch of a lab's job")
    parser.add_argument("--cell-timeout", type=float, default=60.0, help="seconds for any other cell")
    parser.add_argument("--disk-mb", type=int, default=512, help="the most a notebook may write, in MiB")
    args = parser.parse_args(argv)
    if not (args.course / "gradebook.db").is_file():
        parser.error(f"{args.course} is not a built nbgrader course: run `make instructor-edition` first")
    start = time.monotonic()
    grades = grade_all(
        args.submissions.resolve(),
        args.course.resolve(),
        args.out.resolve(),
        lab_timeout=args.lab_timeout,
        cell_timeout=args.cell_timeout,
        disk_mb=args.disk_mb,
    )
    students = len({g.student for g in grades})
    seconds = time.monotonic() - start
    print(f"graded {students} students in ~{seconds:.0f} s: {args.out / 'grades.csv'}, {args.out / 'feedback'}/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
