#!/usr/bin/env python3
"""Every function libkvedge.so exports (clients/lib/libkvedge.map) is documented where users
read it: its declaration in the installed headers has a comment block directly above it, or
above the run of declarations it belongs to (declarations with no blank line between them
share the comment above the first). The comment says what the function does, its errors and
who owns what (docs/contributing.md); this checks that it is there.

usage: test_doc_comments.py LIBKVEDGE_MAP INSTALLED_INCLUDE_DIR
Exit 0 when every exported function is documented, 1 otherwise (each one named)."""
import glob
import os
import re
import sys


def exported(map_path):
    text = re.sub(r"/\*.*?\*/", "", open(map_path).read(), flags=re.S)
    m = re.search(r"global:(.*?)local:", text, flags=re.S)
    if not m:
        sys.exit(f"{map_path}: no global: ... local: section")
    return sorted(set(re.findall(r"\b(kvedge_\w+)\s*;", m.group(1))))


def is_decl_line(line):
    """A line of a function declaration: its first line (a type then a name and "("), or a
    continuation of its parameters (indented, or ending a parameter list)."""
    s = line.rstrip()
    if not s:
        return False
    if s.startswith((" ", "\t")):
        return not s.lstrip().startswith(("*", "/*"))
    return re.match(r"^[A-Za-z_][\w \t\*]*\b\w+\s*\(", s) is not None and not s.startswith(
        ("typedef", "#", "struct", "}"))


def documented(lines, i):
    """lines[i] starts the declaration: walk up over the run of declarations to a comment."""
    j = i - 1
    while j >= 0:
        s = lines[j].rstrip()
        if s.endswith("*/"):
            return True
        if not is_decl_line(lines[j]):
            return False
        j -= 1
    return False


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    names = exported(sys.argv[1])
    headers = sorted(glob.glob(os.path.join(sys.argv[2], "kvedge", "*.h")))
    if not headers:
        sys.exit(f"no installed headers under {sys.argv[2]}/kvedge")
    decls = {}
    for h in headers:
        lines = open(h).read().split("\n")
        in_comment = False
        for i, line in enumerate(lines):
            s = line.strip()
            starts_comment = s.startswith("/*")
            if in_comment or starts_comment:
                in_comment = "*/" not in s if (in_comment or starts_comment) else False
                continue
            if line.startswith((" ", "\t")):
                continue
            for m in re.finditer(r"\b(kvedge_\w+)\s*\(", line):
                if m.group(1) in names and m.group(1) not in decls:
                    decls[m.group(1)] = (h, i, documented(lines, i))
    bad = 0
    for n in names:
        if n not in decls:
            print(f"FAIL: {n}: exported but declared in no installed header")
            bad += 1
        elif not decls[n][2]:
            h, i, _ = decls[n]
            print(f"FAIL: {n} ({os.path.basename(h)}:{i + 1}): no comment block above it")
            bad += 1
    print(f"{len(names) - bad} of {len(names)} exported functions documented")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
