#!/usr/bin/env python3
"""Runs the shell blocks of the docs as a reader would, so that a command the docs show cannot
stop working unnoticed (as rustdoc runs the examples of Rust documentation).

Which blocks: every ```sh block of README.md, and in other files the ```sh blocks marked to run
by an HTML comment on the line before them, `<!-- doc-test: run -->` (tutorial sections). A
README block opts out with `<!-- doc-test: skip: REASON -->` on the line before it; the reason
is required. The chosen blocks of one file run in order in one bash shell (`set -eo pipefail`,
aliases expanded), so a variable or a background daemon of one block serves the next, in a
temporary directory that holds the repository's top-level entries as symlinks and `build`
pointing at the build tree: `build/clients/kvedge` is the binary under test. Background jobs the
blocks leave are killed at the end, and the directory is removed.

usage: run_doc_blocks.py REPO BUILD_DIR [FILE...]     (FILE relative to REPO; default README.md)
       run_doc_blocks.py --list REPO [FILE...]       (print the blocks and what happens to them)
Exit 0 when every block ran and succeeded, 1 when one failed (its file and line named, with the
shell's output), 77 when a prerequisite is missing (the kvedge binary, bash, curl, a TCP port a
block binds that something else holds)."""
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile

SKIP = 77
TIMEOUT_S = 540  # an ASan build under a loaded ctest -j takes several times the 25 s
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
    for tool in ("bash", "curl"):
        if tool in ("bash",) or re.search(r"\b%s\b" % tool, text):
            if not shutil.which(tool):
                return f"{tool} is not installed"
    ports = set()
    for host, port in re.findall(r"--bind tcp://([0-9.]+):(\d+)", text):
        ports.add(("0.0.0.0" if host == "0.0.0.0" else host, int(port)))
    for port in re.findall(r"\b127\.0\.0\.1:(\d+)/", text):  # metrics endpoints a block reads
        ports.add(("127.0.0.1", int(port)))
    for host, port in sorted(ports):
        if port_taken(host, port):
            return f"TCP port {port} is in use on this host (a block binds it)"
    return None


def script(path, chosen):
    parts = ["set -eo pipefail", "shopt -s expand_aliases",
             # what the blocks leave running is stopped, however the shell ends
             'trap \'kill $(jobs -p) 2>/dev/null; wait 2>/dev/null\' EXIT']
    for line, text, _, _ in chosen:
        parts.append(f"echo '== {path}:{line}' >&2")
        parts.append(text)
    return "\n".join(parts) + "\n"


def run_file(repo, build, rel):
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
            os.symlink(os.path.join(repo, entry), os.path.join(tmp, entry))
        os.symlink(os.path.abspath(build), os.path.join(tmp, "build"))
        try:
            p = subprocess.run(["bash", "-c", script(rel, chosen)], cwd=tmp,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               timeout=TIMEOUT_S)
            out, status = p.stdout, f"exited {p.returncode}" if p.returncode else ""
        except subprocess.TimeoutExpired as e:
            out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else e.stdout
            out, status = out or "", f"did not finish in {TIMEOUT_S} s"
        if status:
            last = [l for l in out.split("\n") if l.startswith(f"== {rel}:")]
            where = last[-1][3:] if last else rel
            print(out[-20000:])
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
    if len(argv) < 3:
        sys.exit(__doc__)
    repo, build = os.path.abspath(argv[1]), argv[2]
    if not os.access(os.path.join(build, "clients", "kvedge"), os.X_OK):
        print(f"SKIP: {build}/clients/kvedge is not built")
        return SKIP
    results = [run_file(repo, build, rel) for rel in argv[3:] or ["README.md"]]
    if 1 in results:
        return 1
    return SKIP if SKIP in results else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
