#!/usr/bin/env python3
"""The hot loops of `optc --emit=asm` output, and their instructions per element.

Reads the assembly on stdin. A loop is a label that a later conditional or
unconditional jump in the same function jumps back to; its body is the
instructions from the label to that jump (the last such jump), inner labels
included. For each function (optc_phaseN) it prints, of the innermost loops
(no other loop starts inside), the hot one: of those that prefetch (every
full-vector loop does, but on AMD CPUs, where none does; the masked tail,
whose block layout can look like a loop, does not) and have at least half
the most vector (zmm/ymm) instructions, the one with the fewest divider
ops (vdivps, vsqrtps), then the fewest vector instructions (a fused body's
loop for chunks in none of torch's remainders, beside the one that tests
each element's place). Where optc emits
a loop twice, one multiplying by a reciprocal where a per-call check says
that rounds as the divide (all but rare steps) and one dividing (not
pipelined, so larger), the first is what runs; and without AVX-512 a third
may round holds half up where a per-call check finds no tie (fewer
instructions again), which is what runs then. It prints the body's
instruction count (the fall-through path: blocks laid out past the loop's
jump back are not counted), its software prefetches, the
vector width in f32 lanes (16 for zmm, 8 for ymm), the elements one
iteration covers (the step of the register its loads index by: 16, optc's
vector, on both targets, so an AVX2 iteration is two ymm wide) and the
instructions per element, prefetches left out (they use the load ports,
not the vector ALUs), its divider ops, its gathers and its vcvtneps2bf16
(AVX512-BF16's rounding, where optc uses it):

    optc_phase1: loop .LBB1_11: 124 instructions, 4 prefetches, 16 lanes, 16 elements, 7.50 per element, 3 divider ops, 0 gathers, 0 cvtneps2bf16

With --max F, exits 1 when a phase's figure is above F (--phase N: only that
phase).
"""
import argparse
import re
import sys


def sixteen(insns, x, reg):
    """Whether the vector access x moves 16-bit elements: on AVX2, a load
    that vpunpck{l,h}wd widen, or a store of what vpackusdw packed."""
    if not re.match(r"^\s+vmovdq[ua]\s", x):
        return False
    store = x.rstrip().endswith(")")
    ops = ("vpackusdw",) if store else ("vpunpcklwd", "vpunpckhwd")
    return any(y.lstrip().startswith(ops) and reg in y for y in insns)


def loops(lines):
    fn, body = None, []
    funcs = {}
    for ln in lines:
        m = re.match(r"^(optc_phase\d+):", ln)
        if m:
            fn = m.group(1)
            funcs[fn] = body = []
            continue
        if fn:
            body.append(ln.rstrip())
    for fn, body in funcs.items():
        labels = {}
        for i, ln in enumerate(body):
            m = re.match(r"^(\.LBB\d+_\d+):", ln)
            if m:
                labels[m.group(1)] = i
        spans = {}  # loop label -> (start, last backward jump)
        for i, ln in enumerate(body):
            m = re.match(r"^\s+j\w+\s+(\.LBB\d+_\d+)", ln)
            if m and m.group(1) in labels and labels[m.group(1)] < i:
                spans[m.group(1)] = (labels[m.group(1)], i)
        # A block laid out after a loop that jumps back into it (an unlikely
        # branch's out-of-line path: the exact redo of an iteration whose
        # vcvtneps2bf16 met a NaN or a subnormal) is not a loop of its own.
        spans = {l: (lo, hi) for l, (lo, hi) in spans.items()
                 if not any(lo2 < lo <= hi2 < hi for l2, (lo2, hi2) in spans.items() if l2 != l)}
        inner = []
        for label, (lo, hi) in spans.items():
            # innermost only: no other loop starts inside this one
            if any(lo < lo2 <= hi for l2, (lo2, _) in spans.items() if l2 != label):
                continue
            insns = [x for x in body[lo + 1:hi + 1] if x.startswith("\t") and not x.lstrip().startswith(".")]
            vec = sum(("%zmm" in x or "%ymm" in x) for x in insns)
            div = sum(bool(re.match(r"^\s+v(div|sqrt)p[sd]\s", x)) for x in insns)
            inner.append((label, insns, vec, div))
        pf = [x for x in inner if any(y.lstrip().startswith("prefetch") for y in x[1])]
        inner = pf or inner
        top = max((x[2] for x in inner), default=0)
        hot = [x for x in inner if x[2] >= 0.5 * top]
        best = min(hot, key=lambda x: (x[3], x[2])) if hot else None
        if best:
            insns, divs = best[1], best[3]
            lanes = 16 if any("%zmm" in x for x in insns) else 8
            # the index register's step: in elements where the operand
            # scales it by the element's size; in bytes where it does not,
            # divided by the bytes a lane of a vector access takes (the
            # register's width over the lanes, half that for a widening
            # vpmovzxwd; the least over its accesses, as AVX2 stores 16
            # bf16 from one ymm)
            per = {}
            for x in insns:
                for m in re.finditer(r"\(%\w*,(%\w+)(,\d)?\)", x):
                    if m.group(2):
                        per[m.group(1)] = 1
                    else:
                        reg = re.search(r"%([xyz])mm\d+", x)
                        if reg:
                            width = {"x": 16, "y": 32, "z": 64}[reg.group(1)]
                            if "vpmovzxwd" in x or sixteen(insns, x, reg.group(0)):
                                width //= 2
                            per[m.group(1)] = min(per.get(m.group(1), width), width // lanes)
            steps = [int(m.group(2)) // per[m.group(3)] for x in insns
                     for m in [re.match(r"^\s+add[ql]\s+\$(-?)(\d+),\s+(%\w+)$", x)]
                     if m and not m.group(1) and m.group(3) in per]
            prefetches = sum(x.lstrip().startswith("prefetch") for x in insns)
            gathers = sum(bool(re.match(r"^\s+v(p)?gather", x)) for x in insns)
            cvts = sum(bool(re.match(r"^\s+vcvtneps2bf16\s", x)) for x in insns)
            yield fn, best[0], len(insns), prefetches, lanes, steps[0] if len(steps) == 1 else lanes, divs, gathers, cvts


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--max", type=float)
    ap.add_argument("--phase", type=int)
    a = ap.parse_args()
    bad = False
    found = False
    for fn, label, n, prefetches, lanes, elems, divs, gathers, cvts in loops(sys.stdin.read().splitlines()):
        if a.phase is not None and fn != f"optc_phase{a.phase}":
            continue
        found = True
        per = (n - prefetches) / elems
        print(f"{fn}: loop {label}: {n} instructions, {prefetches} prefetches, {lanes} lanes, {elems} elements, "
              f"{per:.2f} per element, {divs} divider ops, {gathers} gathers, {cvts} cvtneps2bf16")
        if a.max is not None and per > a.max:
            print(f"{fn}: {per:.2f} instructions per element is above {a.max}")
            bad = True
    if not found:
        print("no loop found")
        return 1
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
