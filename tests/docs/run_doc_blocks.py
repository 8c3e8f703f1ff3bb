#!/usr/bin/env python3
"""Runs the shell blocks of the docs as a reader would, so that a command the docs show cannot
stop working unnoticed (as rustdoc runs the examples of Rust documentation).

Which blocks: every ```sh block of README.md, and in other files the ```sh blocks marked to run
by an HTML comment on the line before them, `<!-- doc-test: run -->` (tutorial sections). A
block opts out with `<!-- doc-test: skip: REASON -->` on the line before it; the reason is
required. The chosen blocks of one file run in order in one bash shell (`set -eo pipefail`,
aliases expanded), so a variable or a background daemon of one block serves the next, in a
temporary directory that holds the repository's top-level entries as symlinks, except copies
of docs/ and models/ (so a block that writes beside the committed files, a heatmap or a map,
changes nothing in the tree), and `build` pointing at the build tree. The shell starts with
what a reader who ran `make install` would have, and nothing from the caller's kvedge settings:
  PATH         build/clients first: `kvedge` is the binary under test
  KVEDGE_LIB   build/clients/libkvedge.so, for the Python package (docs/python.md)
  KVEDGE_DATA, KVEDGE_HOST, KVEDGE_SERVER_KEY, KVEDGE_CERT   unset
Whatever the blocks leave running (background daemons, their children) is killed at the end:
the shell runs in a process group of its own, which gets SIGTERM and then SIGKILL; then the
directory is removed.

usage: run_doc_blocks.py [--timeout S] REPO BUILD_DIR [FILE...]
                                  (FILE relative to REPO; default README.md; S per file, 540)
       run_doc_blocks.py --list REPO [FILE...]       (print the blocks and what happens to them)
Exit 0 when every block ran and succeeded, 1 when one failed (its file and line named, with the
shell's output), 77 when a prerequisite is missing (the kvedge binary, bash; curl, etcd, etcdctl
or jq where a block uses them; a TCP port a block binds or polls that something else holds;
a venv module, NumPy and PyTorch in /usr/bin/python3 for python.md's blocks)."""
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

SKIP = 77
TIMEOUT_S = 540  # an ASan build under a loaded ctest -j takes several times the README's 25 s
COPIED = ("docs", "models")  # what a block may write into beside committed files
UNSET = ("KVEDGE_DATA", "KVEDGE_HOST", "KVEDGE_SERVER_KEY", "KVEDGE_CERT")
MARK = re.compile(r"^<!--\s*doc-test:\s*(run|skip)\s*(?::\s*(.*?))?\s*-->\s*$")


def blocks(path, readme):
    """(line, text, action, reason) of each ```sh block of path; action is run or skip."""
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    out = []
    i = 0
    while i < len(lines):
        if lines[i].strip() != "```sh":
            i += 1
            continue
        start = i + 1
        j = start
        while j < len(lines) and lines[j].strip() != "```":
            j += 1
        if j == len(lines):
            sys.exit(f"{path}:{i + 1}: a ```sh block that does not end")
        prev = lines[i - 1] if i > 0 else ""
        m = MARK.match(prev.strip())
        if m and m.group(1) == "skip":
            if not m.group(2):
                sys.exit(f"{path}:{i}: `doc-test: skip` needs a reason: "
                         "<!-- doc-test: skip: REASON -->")
            action, reason = "skip", m.group(2)
        elif m or readme:
            action, reason = "run", ""
        else:
            action, reason = "skip", "not marked <!-- doc-test: run -->"
        out.append((start, "\n".join(lines[start:j]), action, reason))
        i = j + 1
    return out


def port_taken(host, port):
    """Whether a TCP port a block binds is held by something else now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


def prerequisites(text):
    """Why the blocks cannot run here, or None."""
    for tool in ("bash", "curl", "etcd", "etcdctl", "jq"):
        if tool in ("bash",) or re.search(r"\b%s\b" % tool, text):
            if not shutil.which(tool):
                return f"{tool} is not installed"
    ports = set()
    # (a port the shell computes, 740$((4 + i)), is not one to check)
    for host, port in re.findall(r"--(?:bind|pub) tcp://([0-9.]+):(\d+)\b(?!\$)", text):
        ports.add(("0.0.0.0" if host == "0.0.0.0" else host, int(port)))
    for port in re.findall(r"\b127\.0\.0\.1:(\d+)/", text):  # metrics endpoints a block reads
        ports.add(("127.0.0.1", int(port)))
    for port in re.findall(r"--metrics 127\.0\.0\.1:(\d+)", text):
        if port != "0":
            ports.add(("127.0.0.1", int(port)))
    if "-m venv" in text and subprocess.run(["/usr/bin/python3", "-c", "import ensurepip"],
                                            capture_output=True).returncode:
        return "/usr/bin/python3 has no working venv module (Debian: python3-venv)"
    if "clients/python/examples/" in text:
        py = "/usr/bin/python3"
        if subprocess.run([py, "-c", "import numpy, torch"], capture_output=True).returncode:
            return f"{py} has no NumPy or PyTorch (scripts/setup.sh installs them)"
    for host, port in sorted(ports):
        if port_taken(host, port):
            return f"TCP port {port} is in use on this host (a block binds it)"
    return None


def script(path, chosen):
    parts = ["set -eo pipefail", "shopt -s expand_aliases",
             # what the blocks leave running is stopped, however the shell ends (the runner
             # then kills the shell's process group: what the jobs started themselves)
             # (a job a block stopped and waited for may still be listed: kill fails then,
             # which must not become the script's status)
             'trap \'s=$?; kill $(jobs -p) 2>/dev/null || :; wait 2>/dev/null || :; exit $s\' EXIT']
    for line, text, _, _ in chosen:
        parts.append(f"echo '== {path}:{line}' >&2")
        parts.append(text)
    return "\n".join(parts) + "\n"


def stop_group(pgid):
    """SIGTERM to what is left of the shell's process group, SIGKILL to what outlives 5 s."""
    for sig, grace in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 0.0)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        end = time.monotonic() + grace
        while time.monotonic() < end:
            try:
                os.killpg(pgid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.05)  # the poll interval of a wait with a deadline


def run_shell(text, cwd, env, timeout_s):
    """Runs the script in bash in a process group of its own: (output, "" or why it failed).
    The output goes to a file, not a pipe, so a daemon that outlives the shell holding its
    stdout cannot keep the runner waiting."""
    with tempfile.TemporaryFile(mode="w+", encoding="utf-8", errors="replace") as log:
        p = subprocess.Popen(["bash", "-c", text], cwd=cwd, env=env, stdout=log,
                             stderr=subprocess.STDOUT, start_new_session=True)
        try:
            p.wait(timeout=timeout_s)
            status = f"exited {p.returncode}" if p.returncode else ""
        except subprocess.TimeoutExpired:
            status = f"did not finish in {timeout_s} s"
        stop_group(p.pid)
        p.wait()
        log.seek(0)
        return log.read(), status


def run_file(repo, build, rel, timeout_s):
    path = os.path.join(repo, rel)
    chosen = [b for b in blocks(path, rel == "README.md") if b[2] == "run"]
    if not chosen:
        print(f"{rel}: no block to run")
        return 0
    why = prerequisites("\n".join(b[1] for b in chosen))
    if why:
        print(f"SKIP: {rel}: {why}")
        return SKIP
    tmp = tempfile.mkdtemp(prefix="kvedge-doc-")
    try:
        for entry in os.listdir(repo):
            if entry.startswith(".") or entry == "build":
                continue
            src, dst = os.path.join(repo, entry), os.path.join(tmp, entry)
            if entry in COPIED and os.path.isdir(src):
                shutil.copytree(src, dst, symlinks=True)
            else:
                os.symlink(src, dst)
        os.symlink(os.path.abspath(build), os.path.join(tmp, "build"))
        env = {k: v for k, v in os.environ.items() if k not in UNSET}
        env["PATH"] = os.path.join(tmp, "build", "clients") + os.pathsep + env.get("PATH", "")
        env["KVEDGE_LIB"] = os.path.join(tmp, "build", "clients", "libkvedge.so")
        out, status = run_shell(script(rel, chosen), tmp, env, timeout_s)
        print(out[-20000:])
        if status:
            last = [l for l in out.split("\n") if l.startswith(f"== {rel}:")]
            where = last[-1][3:] if last else rel
            print(f"FAIL: the block at {where} {status}")
            return 1
        print(f"ok: {rel}: {len(chosen)} blocks ran")
        return 0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main(argv):
    if len(argv) >= 3 and argv[1] == "--list":
        repo = argv[2]
        for rel in argv[3:] or ["README.md"]:
            for line, _, action, reason in blocks(os.path.join(repo, rel), rel == "README.md"):
                print(f"{rel}:{line}: {action}" + (f" ({reason})" if reason else ""))
        return 0
    timeout_s = TIMEOUT_S
    if len(argv) >= 3 and argv[1] == "--timeout":
        timeout_s = float(argv[2])
        argv = argv[:1] + argv[3:]
    if len(argv) < 3:
        sys.exit(__doc__)
    repo, build = os.path.abspath(argv[1]), argv[2]
    if not os.access(os.path.join(build, "clients", "kvedge"), os.X_OK):
        print(f"SKIP: {build}/clients/kvedge is not built")
        return SKIP
    results = [run_file(repo, build, rel, timeout_s) for rel in argv[3:] or ["README.md"]]
    if 1 in results:
        return 1
    return SKIP if SKIP in results else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
