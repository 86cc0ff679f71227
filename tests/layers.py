#!/usr/bin/env python3
"""The layers, checked at the level of single includes.

meson.build gives each room's library the include directories of the rooms
below it, so that an #include the wrong way does not compile. This script
checks what the build cannot see:
  - an #include by relative path ("../runtime/x.h") is found beside the file
    whatever the include directories say: none is allowed outside tests/;
  - a room that may use one header of a room above its own (runtime/io
    takes compiler/numerics.h, the 16-bit conversions, and nothing else of
    the compiler) gets that directory whole in the build.
Every #include "..." of every source file must name a header of its own
room or of a room it may use (DESIGN.md draws them).

usage: layers.py SOURCE_ROOT
"""
import os
import re
import sys

# room -> the rooms it may include from (besides itself)
BELOW = {
    "base": [],
    "compiler": ["base"],
    "compiler/cpu": ["compiler", "base"],
    "compiler/cuda": ["compiler", "base"],
    "runtime/exec": ["compiler/cpu", "compiler/cuda", "compiler", "base"],
    "include": [],
    "api": ["include", "runtime/exec", "compiler/cpu", "compiler/cuda", "compiler", "base"],
    "runtime/io": ["base"],
    "runtime/group": ["include", "runtime/io", "runtime/exec", "compiler/cpu", "compiler/cuda", "compiler", "base"],
    "runtime/model": ["runtime/exec", "compiler/cpu", "compiler/cuda", "compiler", "base"],
    "runtime/data": ["runtime/model", "base"],
}
BELOW["runtime/dist"] = ["runtime/group", "runtime/model"] + BELOW["runtime/group"]
BELOW["runtime/train"] = ["runtime/dist", "runtime/data"] + BELOW["runtime/dist"]
BELOW["tools"] = ["bench", "runtime/train"] + BELOW["runtime/train"]
BELOW["bench"] = ["tools", "runtime/train"] + BELOW["runtime/train"]
# single headers a room may take from a room it may not otherwise use
ALSO = {"runtime/io": ["compiler/numerics.h"]}
# headers that are generated or given by a tool, not a room
EXTERNAL = {"ops.def"}  # compiler/, included by ir.h and ir.c (a room's own)

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..")
    root = os.path.abspath(root)
    owner = {}  # header name -> room
    sources = []  # (room, path)
    for room in BELOW:
        d = os.path.join(root, room)
        for dirpath, _, names in os.walk(d):
            rel = os.path.relpath(dirpath, root)
            # a subfolder that is a room of its own is walked as that room
            if rel != room and rel in BELOW:
                continue
            for n in names:
                if n.endswith((".h", ".def")):
                    if n in owner and owner[n] != room:
                        print("layers: %s is a header name in both %s and %s" % (n, owner[n], room))
                        return 1
                    owner[n] = room
                if n.endswith((".c", ".h")):
                    sources.append((room, os.path.join(dirpath, n)))
    bad = 0
    for room, path in sorted(sources):
        text = open(path, encoding="utf-8", errors="replace").read()
        for m in INCLUDE.finditer(text):
            name = m.group(1)
            line = text.count("\n", 0, m.start()) + 1
            where = "%s:%d" % (os.path.relpath(path, root), line)
            if "/" in name:
                print("%s: #include \"%s\" by path; include a header by its name, from a room below" % (where, name))
                bad += 1
                continue
            if name.endswith(".c") or name in EXTERNAL:
                continue
            home = owner.get(name)
            if home is None:
                continue  # a system header spelled with quotes, or a generated one
            if home == room or home in BELOW[room] or "%s/%s" % (home, name) in ALSO.get(room, []):
                continue
            print("%s: #include \"%s\" reaches up from %s into %s" % (where, name, room, home))
            bad += 1
    print("layers: %d source files, %d headers in %d rooms: %s" %
          (len(sources), len(owner), len(BELOW), "%d wrong-way includes" % bad if bad else "every include downward"))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
