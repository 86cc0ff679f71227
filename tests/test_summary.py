#!/usr/bin/env python3
"""tests/summary.py on made-up build folders: what it counts when a run
passes, skips, fails, crashes before writing its report, or leaves a stale
report behind. No torch, no meson run: each case writes the files meson,
lit and ./setup.sh test would have written.

usage: test_summary.py [SUMMARY_PY]
"""
import json
import os
import subprocess
import sys
import tempfile
import time

here = os.path.dirname(os.path.abspath(__file__))
summary = sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "summary.py")

JUNIT_CASE = '<testcase classname="%s" name="%s">%s</testcase>'


def junit(path, cases, mtime=None):
    """cases: (name, 'pass' | 'fail' | 'skip')."""
    body = {"pass": "", "fail": "<failure/>", "skip": '<skipped message="Skipped: no CUDA device"/>'}
    with open(path, "w") as f:
        f.write('<?xml version="1.0"?><testsuites><testsuite name="s">')
        f.write("".join(JUNIT_CASE % ("c", n, body[r]) for n, r in cases))
        f.write("</testsuite></testsuites>\n")
    if mtime is not None:
        os.utime(path, (mtime, mtime))


def build(root, name, tests, lit_cases=None, lit_mtime=None, pytest_cases=None, pytest_mtime=None, pytest_rc=None):
    """A build folder: meson's testlog.json (tests: (name, result, start)), and
    lit.xml, pytest.xml and pytest.rc when given."""
    b = os.path.join(root, name)
    os.makedirs(os.path.join(b, "meson-logs"))
    os.makedirs(os.path.join(b, "tests"))
    with open(os.path.join(b, "meson-logs", "testlog.json"), "w") as f:
        for n, result, start in tests:
            f.write(json.dumps({"name": n, "result": result, "starttime": start, "duration": 10.0,
                                "returncode": 0 if result == "OK" else 1}) + "\n")
    if lit_cases is not None:
        junit(os.path.join(b, "tests", "lit.xml"), lit_cases, lit_mtime)
    if pytest_cases is not None:
        junit(os.path.join(b, "pytest.xml"), pytest_cases, pytest_mtime)
    if pytest_rc is not None:
        rc, start = pytest_rc
        with open(os.path.join(b, "pytest.rc"), "w") as f:
            f.write("%d %.3f\n" % (rc, start))
    return b


def run(b):
    p = subprocess.run([sys.executable, summary, b], capture_output=True, text=True)
    last = p.stdout.strip().splitlines()[-1]
    n = [int(x) for x in last.replace(",", " ").split() if x.isdigit()]
    return p.returncode, n[0], n[1], p.stdout


failed = 0


def expect(what, b, passed, nfailed, rc, contains=None):
    global failed
    got_rc, p, f, out = run(b)
    ok = (p, f) == (passed, nfailed) and (got_rc != 0) == (rc != 0) and (contains is None or contains in out)
    print("%s: %s (%d passed, %d failed, exit %d)" % ("ok" if ok else "FAIL", what, p, f, got_rc))
    if not ok:
        print("  expected %d passed, %d failed, exit %s%s\n%s" %
              (passed, nfailed, "non-zero" if rc else "0", ", with '%s'" % contains if contains else "", out))
        failed += 1


now = time.time()
long_ago = now - 7 * 86400
with tempfile.TemporaryDirectory() as root:
    # a normal pass: meson's tests, lit's cases and pytest's, all written by this run
    b = build(root, "pass", [("api", "OK", now), ("lit", "OK", now - 5)], lit_cases=[("a", "pass"), ("b", "pass")],
              lit_mtime=now, pytest_cases=[("t1", "pass"), ("t2", "pass")], pytest_mtime=now, pytest_rc=(0, now - 1))
    expect("a normal pass", b, 5, 0, 0)

    # skips: a meson test that exits 77, a lit case and a pytest case marked skipped
    b = build(root, "skips", [("gpu", "SKIP", now), ("api", "OK", now), ("lit", "OK", now - 5)],
              lit_cases=[("a", "pass"), ("b", "skip")], lit_mtime=now,
              pytest_cases=[("t1", "skip"), ("t2", "pass")], pytest_mtime=now, pytest_rc=(0, now - 1))
    expect("skips are neither passed nor failed", b, 3, 0, 0, contains="3 skipped")
    expect("each skip is listed with its reason", b, 3, 0, 0, contains="1 x pytest: no CUDA device")
    expect("a meson test that skipped is named", b, 3, 0, 0, contains="meson test gpu (exit 77")

    # pytest crashed (a segfault in liboptc) before writing its XML; an old one is left from last week
    b = build(root, "crash-stale", [("api", "OK", now)], pytest_cases=[("t1", "pass")], pytest_mtime=long_ago,
              pytest_rc=(139, now - 1))
    expect("pytest crashed; only last week's pytest.xml", b, 1, 1, 1, contains="exited 139")
    b = build(root, "crash-none", [("api", "OK", now)], pytest_rc=(139, now - 1))
    expect("pytest crashed before writing any pytest.xml", b, 1, 1, 1, contains="exited 139")

    # pytest was interrupted after writing a report with no failure in it
    b = build(root, "interrupted", [("api", "OK", now)], pytest_cases=[("t1", "pass")], pytest_mtime=now,
              pytest_rc=(2, now - 1))
    expect("pytest exited 2 with a clean report", b, 2, 1, 1)

    # pytest's failures are counted one by one, its exit status 1 explained by them
    b = build(root, "pytest-fail", [("api", "OK", now)], pytest_cases=[("t1", "fail"), ("t2", "pass")],
              pytest_mtime=now, pytest_rc=(1, now - 1))
    expect("pytest failures", b, 2, 1, 1, contains="pytest: c::t1")

    # meson says lit FAILed (it crashed); lit.xml is a stale all-pass one from an earlier run
    b = build(root, "lit-stale", [("lit", "FAIL", now)], lit_cases=[("a", "pass"), ("b", "pass")], lit_mtime=long_ago)
    expect("lit FAIL with a stale lit.xml", b, 0, 1, 1, contains="no lit.xml from this run")

    # meson says lit FAILed, and its fresh lit.xml names the failing case
    b = build(root, "lit-fail", [("lit", "FAIL", now - 5)], lit_cases=[("a", "pass"), ("b", "fail")], lit_mtime=now)
    expect("lit FAIL with this run's lit.xml", b, 1, 1, 1, contains="lit: b")

    # meson says OK but lit wrote no report: nothing to count is not a pass
    b = build(root, "lit-none", [("lit", "OK", now)])
    expect("lit OK with no lit.xml", b, 0, 1, 1)

    # meson TIMEOUT on lit, with a fresh lit.xml that lists no failure
    b = build(root, "lit-timeout", [("lit", "TIMEOUT", now - 5)], lit_cases=[("a", "pass")], lit_mtime=now)
    expect("lit TIMEOUT, a report with no failure", b, 1, 1, 1)

    # no meson log at all
    b = os.path.join(root, "empty")
    os.makedirs(b)
    expect("a build folder where meson test never ran", b, 0, 1, 1)

sys.exit(1 if failed else 0)
