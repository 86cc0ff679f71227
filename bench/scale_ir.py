#!/usr/bin/env python3
"""How optc's IR stages scale with the graph: text to phase plan.

Generates step graphs of N instructions in several shapes, runs
`optc --emit=plan` on each (the whole path, as a user runs it) and, when
the driver is built (build/tests/scale_ir, from bench/scale_ir.c), the time
of every stage on its own: parse, verify, print, parse of the printed
text, option binding, and each pass of the pipeline. Prints a table with
the growth ratio from one size to the next: linear stages grow as N does
(5x from 10k to 50k, 2x after), quadratic ones as N squared.

    bench/scale_ir.py                          # the table, 10k .. 200k
    bench/scale_ir.py --sizes 20000,40000 --shapes chain
    bench/scale_ir.py --gen clip 200000 > g.optir
    bench/scale_ir.py --check                  # exit 1 when the end-to-end time
                                               # grows far faster than N

Shapes:
  chain   a chain of adds on the param (one phase)
  tree    a balanced tree of adds over per-element leaves, each a mul by a
          distinct constant
  clip    two phases: a long chain of per-element values, their sum of
          squares, and a second chain that reads the norm and the first
          chain's end (which the second phase recomputes)
  steps   a long chain of step-scope values (hoisted out of the loop) that
          scales the update
  fold    a chain of constants that canonicalize folds into one
"""
import argparse
import os
import subprocess
import sys
import tempfile
import time

HEAD = "param @param : f32\ngrad @grad : f32\n"


def gen_chain(n):
    out = [HEAD, "%p = load @param : f32\n%g = load @grad : f32\n"]
    prev = "%p"
    for i in range(max(n - 3, 1)):
        out.append(f"%v{i} = add {prev}, %g : f32\n")
        prev = f"%v{i}"
    out.append(f"store @param, {prev}\n")
    return "".join(out)


def gen_tree(n):
    leaves = max(n // 3, 2)
    out = [HEAD, "%p = load @param : f32\n%g = load @grad : f32\n"]
    level = []
    for i in range(leaves):
        out.append(f"%c{i} = const {i + 2}.0 : f32\n%l{i} = mul %g, %c{i} : f32\n")
        level.append(f"%l{i}")
    k = 0
    while len(level) > 1:
        nxt = []
        for j in range(0, len(level) - 1, 2):
            out.append(f"%t{k} = add {level[j]}, {level[j + 1]} : f32\n")
            nxt.append(f"%t{k}")
            k += 1
        if len(level) % 2:
            nxt.append(level[-1])
        level = nxt
    out.append(f"%p1 = sub %p, {level[0]} : f32\nstore @param, %p1\n")
    return "".join(out)


def gen_clip(n):
    half = max((n - 10) // 2, 1)
    out = [HEAD, "%scale = input 0.5 : f32\n%g = load @grad : f32\n%e0 = mul %g, %scale : f32\n"]
    for i in range(1, half):
        out.append(f"%e{i} = add %e{i - 1}, %g : f32\n")
    e = f"%e{half - 1}"
    out.append(f"%ss = reduce sumsq {e} to step : f64\n%norm = sqrt %ss : f64\n%normf = cvt %norm : f32\n")
    out.append(f"%u0 = div {e}, %normf : f32\n")
    for i in range(1, half):
        out.append(f"%u{i} = add %u{i - 1}, {e} : f32\n")
    out.append(f"%p = load @param : f32\n%p1 = sub %p, %u{half - 1} : f32\nstore @param, %p1\n")
    return "".join(out)


def gen_steps(n):
    out = [HEAD, "%lr = input 0.001 : f64\n%s0 = neg %lr : f64\n"]
    for i in range(1, max(n - 8, 2)):
        out.append(f"%s{i} = mul %s{i - 1}, %lr : f64\n")
    out.append(f"%sf = cvt %s{max(n - 8, 2) - 1} : f32\n%p = load @param : f32\n%g = load @grad : f32\n")
    out.append("%d = mul %g, %sf : f32\n%p1 = add %p, %d : f32\nstore @param, %p1\n")
    return "".join(out)


def gen_fold(n):
    out = [HEAD, "%one = const 1.0 : f64\n%c0 = const 0.5 : f64\n"]
    for i in range(1, max(n - 8, 2)):
        out.append(f"%c{i} = mul %c{i - 1}, %one : f64\n" if i % 2 else f"%c{i} = add %c{i - 1}, %one : f64\n")
    out.append(f"%cf = cvt %c{max(n - 8, 2) - 1} : f32\n%p = load @param : f32\n%g = load @grad : f32\n")
    out.append("%d = mul %g, %cf : f32\n%p1 = sub %p, %d : f32\nstore @param, %p1\n")
    return "".join(out)


SHAPES = {"chain": gen_chain, "tree": gen_tree, "clip": gen_clip, "steps": gen_steps, "fold": gen_fold}


def best_of(reps, fn):
    best = None
    for _ in range(reps):
        r = fn()
        if r is None:
            return None
        best = r if best is None or r[0] < best[0] else best
    return best


def run_optc(optc, path, timeout):
    t0 = time.perf_counter()
    try:
        p = subprocess.run([optc, "--emit=plan", path], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           timeout=timeout)
    except subprocess.TimeoutExpired:
        sys.stderr.write(f"optc --emit=plan {path}: timed out after {timeout} s\n")
        return None
    t = time.perf_counter() - t0
    if p.returncode != 0:
        sys.stderr.write(f"optc --emit=plan {path} failed:\n{p.stderr.decode(errors='replace')[:2000]}\n")
        return None
    return (t, p.stdout.decode().splitlines()[0] if p.stdout else "")


def run_driver(driver, path, timeout):
    t0 = time.perf_counter()
    try:
        p = subprocess.run([driver, path], stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None
    t = time.perf_counter() - t0
    if p.returncode != 0:
        sys.stderr.write(f"{driver} {path} failed:\n{p.stderr.decode(errors='replace')[:2000]}\n")
        return None
    stages = {}
    for kv in p.stdout.decode().split():
        k, v = kv.split("=", 1)
        stages[k] = float(v)
    return (t, stages)


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(here)
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--optc", default=os.path.join(root, "build", "optc"))
    ap.add_argument("--driver", default=os.path.join(root, "build", "tests", "scale_ir"),
                    help="the per-stage driver (bench/scale_ir.c); skipped when missing")
    ap.add_argument("--sizes", default="10000,50000,100000,200000")
    ap.add_argument("--shapes", default="chain,tree,clip,steps,fold")
    ap.add_argument("--reps", type=int, default=3, help="best of this many runs")
    ap.add_argument("--timeout", type=float, default=120)
    ap.add_argument("--gen", nargs=2, metavar=("SHAPE", "N"), help="print one generated graph and exit")
    ap.add_argument("--check", action="store_true",
                    help="the growth check: from the smallest size to the largest, the end-to-end time "
                         "may grow at most --max-excess times faster than N (linear is 1x, quadratic N-fold)")
    ap.add_argument("--max-excess", type=float, default=4.0)
    args = ap.parse_args()

    if args.gen:
        sys.stdout.write(SHAPES[args.gen[0]](int(args.gen[1])))
        return 0
    sizes = [int(s) for s in args.sizes.split(",")]
    shapes = args.shapes.split(",")
    if args.check and args.sizes == ap.get_default("sizes"):
        sizes = [25000, 200000]
    driver = args.driver if os.path.exists(args.driver) else None
    failed = False
    with tempfile.TemporaryDirectory() as tmp:
        for shape in shapes:
            rows = []
            for n in sizes:
                path = os.path.join(tmp, f"{shape}_{n}.optir")
                with open(path, "w") as f:
                    f.write(SHAPES[shape](n))
                e2e = best_of(args.reps, lambda: run_optc(args.optc, path, args.timeout))
                if e2e is None:
                    failed = True
                    break
                st = best_of(args.reps, lambda: run_driver(driver, path, args.timeout)) if driver else None
                rows.append((n, e2e[0], st[1] if st else None))
            print_table(shape, rows)
            if args.check and len(rows) == len(sizes) and len(rows) >= 2:
                (n0, t0, _), (n1, t1, _) = rows[0], rows[-1]
                excess = (t1 / t0) / (n1 / n0)
                verdict = "ok" if excess <= args.max_excess else "FAIL"
                print(f"check {shape}: {n0} -> {n1} instructions ({n1 / n0:.0f}x): time {t1 / t0:.1f}x, "
                      f"{excess:.2f}x linear growth (limit {args.max_excess}x): {verdict}")
                failed |= excess > args.max_excess
            print()
    return 1 if failed else 0


def print_table(shape, rows):
    if not rows:
        return
    stages = [k for k in (rows[0][2] or {}) if k not in ("nins", "out")]
    print(f"== {shape}")
    head = f"{'N':>8} {'insns':>8} {'out':>8} {'optc e2e':>9} {'growth':>7}"
    for s in stages:
        head += f" {s[:12]:>12}"
    print(head + "   (ms; growth: e2e time ratio / N ratio to the row above)")
    prev = None
    for n, t, st in rows:
        g = "" if prev is None else f"{(t / prev[1]) / (n / prev[0]):.2f}"
        line = f"{n:>8} {int(st['nins']) if st else n:>8} {int(st['out']) if st else 0:>8} {t * 1e3:>9.1f} {g:>7}"
        for s in stages:
            line += f" {st[s]:>12.2f}"
        print(line)
        prev = (n, t)


if __name__ == "__main__":
    sys.exit(main())
