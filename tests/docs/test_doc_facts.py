#!/usr/bin/env python3
"""Statements of the docs about the tree, checked against the code that decides them:

- headers: the installed-header list of docs/operations.md ("Install and link", the
  `include/kvedge/*.h` row) names exactly the public set, KVEDGE_PUBLIC_HEADERS in
  clients/lib/CMakeLists.txt, the list cmake installs;
- fuzz: README.md's `make fuzz` list, the Makefile's FUZZ_TARGETS, the kvedge_fuzz_target()
  calls of tests/fuzz/CMakeLists.txt and the tests/fuzz/fuzz_*.c files name the same targets;
- metrics: every metric name docs/operations.md's "Every metric" section gives (the short forms
  `_stored_bytes` after a full name included) is registered by the daemons' code, and every name
  the code registers is in that section;
- labels: the `kind` and `reason` values the `kvedge_proxy_layers_total` row lists are those the
  proxy gives (proxy/collab.c's kinds, access/proto.h's KVEDGE_FETCH_REASON_MAP).

The README's folder table is checked by tests/layout/test_readme_folders.sh.

usage: test_doc_facts.py REPO [CHECK...]   (CHECK: headers, fuzz, metrics, labels; default all)
Exit 0 when every statement holds, 1 otherwise (each disagreement named)."""
import glob
import os
import re
import sys


def read(repo, path):
    with open(os.path.join(repo, path), encoding="utf-8") as f:
        return f.read()


def section(text, title, path):
    """The text of the markdown section whose heading is `title`, up to the next heading of
    the same or a higher level."""
    m = re.search(r"^(#+) " + re.escape(title) + r"\s*$", text, flags=re.M)
    if not m:
        sys.exit(f"{path}: no section \"{title}\"")
    level = len(m.group(1))
    end = re.search(r"^#{1,%d} " % level, text[m.end():], flags=re.M)
    return text[m.end(): m.end() + end.start() if end else len(text)]


def compare(what, doc_name, doc, code_name, code):
    """Prints each name one side has and the other lacks; returns the number of them."""
    bad = 0
    for n in sorted(doc - code):
        print(f"FAIL: {what}: {doc_name} names {n}, which {code_name} does not")
        bad += 1
    for n in sorted(code - doc):
        print(f"FAIL: {what}: {code_name} has {n}, which {doc_name} does not name")
        bad += 1
    if not bad:
        print(f"ok: {what}: {len(doc)} names, the same in {doc_name} and {code_name}")
    return bad


def check_headers(repo):
    ops = read(repo, "docs/operations.md")
    install = section(ops, "Install and link", "docs/operations.md")
    row = re.search(r"^\| `include/kvedge/\*\.h` \|(.*)$", install, flags=re.M)
    if not row:
        sys.exit("docs/operations.md: \"Install and link\" has no `include/kvedge/*.h` row")
    doc = set(re.findall(r"`([A-Za-z0-9_]+\.h)`", row.group(1)))
    cmake = read(repo, "clients/lib/CMakeLists.txt")
    m = re.search(r"set\(KVEDGE_PUBLIC_HEADERS(.*?)\)", cmake, flags=re.S)
    if not m:
        sys.exit("clients/lib/CMakeLists.txt: no set(KVEDGE_PUBLIC_HEADERS ...)")
    code = {os.path.basename(h) for h in m.group(1).split()}
    return compare("installed headers", "docs/operations.md", doc,
                   "KVEDGE_PUBLIC_HEADERS (clients/lib/CMakeLists.txt)", code)


def check_fuzz(repo):
    readme = read(repo, "README.md")
    m = re.search(r"`make fuzz` \(([^()]*(?:\([^()]*\)[^()]*)*)\)", readme)
    if not m:
        sys.exit("README.md: no `make fuzz` (...) list")
    doc = set(re.findall(r"`([a-z0-9_]+)`", m.group(1)))
    cmake = read(repo, "tests/fuzz/CMakeLists.txt")
    code = set(re.findall(r"^kvedge_fuzz_target\(([a-z0-9_]+)", cmake, flags=re.M))
    make = re.search(r"^FUZZ_TARGETS\s*=\s*(.*)$", read(repo, "Makefile"), flags=re.M)
    if not make:
        sys.exit("Makefile: no FUZZ_TARGETS")
    files = {os.path.basename(f)[len("fuzz_"):-2]
             for f in glob.glob(os.path.join(repo, "tests/fuzz/fuzz_*.c"))}
    t = "tests/fuzz/CMakeLists.txt"
    return (compare("fuzz targets", "README.md", doc, t, code) +
            compare("fuzz targets", "the Makefile's FUZZ_TARGETS", set(make.group(1).split()),
                    t, code) +
            compare("fuzz targets", "tests/fuzz/fuzz_*.c", files, t, code))


def registered_metrics(repo):
    """Every "kvedge_..." string literal of the daemons' sources that is not a JSON key: the
    names given to kvedge_metrics_family / _single and the daemons' wrappers of them."""
    names = set()
    for pattern in ("monitor/*.c", "proxy/*.c", "store/*/*.c", "runtime/*.c"):
        for path in glob.glob(os.path.join(repo, pattern)):
            with open(path, encoding="utf-8") as f:
                text = f.read()
            for m in re.finditer(r'"(kvedge_[a-z0-9_]+)"', text):
                calls = re.findall(r"([A-Za-z_]\w*)\s*\(", text[max(0, m.start() - 200):m.start()])
                if calls and calls[-1].startswith("cJSON_"):
                    continue
                names.add(m.group(1))
    return names


def documented_metrics(ops):
    """Metric names of the "Every metric" section: `kvedge_x_y` (labels in braces dropped), and
    in a table's name cell the short form `_z` after a full name, which stands for kvedge_x_z.
    A pattern such as `kvedge_node_*` is no name (it does not match)."""
    every = section(ops, "Every metric", "docs/operations.md")
    names = set()
    for line in every.split("\n"):
        # a table row's first cell holds names (short forms too); prose holds full names only
        row = re.match(r"\| ([^|]*)\|", line)
        prefix = None
        for tok in re.findall(r"`([^`]+)`", row.group(1) if row else line):
            tok = re.sub(r"\{.*$", "", tok)
            full = re.fullmatch(r"(kvedge_[a-z0-9]+)_[a-z0-9_]+", tok)
            if full:
                names.add(tok)
                prefix = full.group(1)
            elif row and prefix and re.fullmatch(r"_[a-z0-9_]+", tok):
                names.add(prefix + tok)
    return names


def check_metrics(repo):
    ops = read(repo, "docs/operations.md")
    return compare("metric names", "docs/operations.md (\"Every metric\")",
                   documented_metrics(ops), "the daemons' code", registered_metrics(repo))


def check_labels(repo):
    ops = read(repo, "docs/operations.md")
    every = section(ops, "Every metric", "docs/operations.md")
    row = re.search(r"^\| `kvedge_proxy_layers_total` \|(.*)$", every, flags=re.M)
    if not row:
        sys.exit("docs/operations.md: no `kvedge_proxy_layers_total` row")
    meaning = row.group(1)
    kinds_doc = re.search(r"source kind \(([^)]*)\)", meaning)
    reasons_doc = re.search(r"reason \(([^)]*)\)", meaning)
    if not kinds_doc or not reasons_doc:
        sys.exit("docs/operations.md: the kvedge_proxy_layers_total row lists no kinds or reasons")
    proto_h = read(repo, "access/proto.h")
    m = re.search(r"#define KVEDGE_FETCH_REASON_MAP\(X\)(.*?)\n\n", proto_h, flags=re.S)
    if not m:
        sys.exit("access/proto.h: no KVEDGE_FETCH_REASON_MAP")
    reasons = set(re.findall(r'X\(\w+,\s*\d+,\s*"([^"]+)"\)', m.group(1)))
    # proxy/collab.c labels kinds below its bound with kvedge_plan_kind_name, the rest "none"
    collab = read(repo, "proxy/collab.c")
    b = re.search(r'k < (\d+) \? kvedge_plan_kind_name\(\(kvedge_plan_kind_t\)k\) : "(\w+)"', collab)
    if not b:
        sys.exit("proxy/collab.c: cannot find how a kind becomes a label")
    values = dict((name, int(v)) for name, v in
                  re.findall(r"(KVEDGE_PLAN_[A-Z]+)\s*=\s*(\d+)", proto_h))
    names = dict(re.findall(r'case (KVEDGE_PLAN_[A-Z]+):\s*return "(\w+)";',
                            read(repo, "access/proto.c")))
    kinds = {names[k] for k, v in values.items() if v < int(b.group(1)) and k in names}
    kinds.add(b.group(2))
    where = "docs/operations.md (kvedge_proxy_layers_total)"
    return (compare("layer kinds", where, set(re.findall(r"`([^`]+)`", kinds_doc.group(1))),
                    "proxy/collab.c and access/proto.c", kinds) +
            compare("layer reasons", where, set(re.findall(r"`([^`]+)`", reasons_doc.group(1))),
                    "KVEDGE_FETCH_REASON_MAP (access/proto.h)", reasons))


CHECKS = {"headers": check_headers, "fuzz": check_fuzz, "metrics": check_metrics,
          "labels": check_labels}


def main(argv):
    if len(argv) < 2:
        sys.exit(__doc__)
    repo = argv[1]
    names = argv[2:] or list(CHECKS)
    bad = 0
    for n in names:
        if n not in CHECKS:
            sys.exit(f"unknown check {n} (one of: {', '.join(CHECKS)})")
        bad += CHECKS[n](repo)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
