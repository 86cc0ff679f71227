#!/usr/bin/env python3
"""Counts test results from one or more meson build directories.

Each meson test counts once, except the lit suite, whose individual test
files are counted from its xunit report; a build directory's pytest.xml
(the pytest suite's junit report, which ./setup.sh test writes) adds each
pytest test. A directory with fuzz.txt and no meson logs (build-fuzz, from
.ci/run) counts each fuzz target and each failed reproducer replay. Prints
one line per build directory, every skip with its reason (grouped:
"skipped: 8 x pytest: no CUDA device"), and last, the line CI reads:
    tests: N passed, M failed
Exits non-zero if anything failed.

A report counts only when it is this run's, and a run that wrote none, or
whose verdict the report does not explain, is a failure:
  - lit: lit.xml counts only if it was written during meson's lit run (its
    mtime within the run); a stale or missing one counts meson's verdict
    alone, and a FAIL whose fresh report lists no failure is one failure.
  - pytest: ./setup.sh test writes pytest.rc ("EXIT START": pytest's exit
    status and the time it started) beside pytest.xml. With pytest.rc, a
    pytest.xml older than START is stale; no fresh report, or a non-zero
    exit the report does not explain (a crash, an interruption, no tests),
    is one failure. Without pytest.rc, a pytest.xml counts as it is.

usage: summary.py BUILD_DIR [BUILD_DIR ...]
"""
import json
import os
import sys
import xml.etree.ElementTree as ET

SLACK = 2.0  # seconds: file times against time.time()'s


def count_fuzz(path):
    """tests/fuzz/run.sh's output: each target's line, and each reproducer replay that failed."""
    passed = failed = 0
    failures = []
    for line in open(path, encoding="utf-8", errors="replace"):
        if line.startswith("fuzz ") and ": " in line and not line.startswith("fuzz: "):
            if line.rstrip().endswith(", ok"):
                passed += 1
            elif "FAILED" in line:
                failed += 1
                failures.append(line.strip())
    if passed + failed == 0:
        return 0, 1, 0, ["%s: no fuzz results" % path]
    return passed, failed, 0, failures


def count_junit(path, prefix):
    """(passed, failed, skipped, failures) of a junit/xunit report, or None when it cannot be read."""
    try:
        root = ET.parse(path).getroot()
    except (ET.ParseError, OSError):
        return None
    passed = failed = skipped = 0
    failures = []
    for case in root.iter("testcase"):
        if case.find("failure") is not None or case.find("error") is not None:
            failed += 1
            name = case.get("name", "?")
            if prefix == "pytest":
                name = "%s::%s" % (case.get("classname", "?"), name)
            failures.append("%s: %s" % (prefix, name))
        elif case.find("skipped") is not None:
            skipped += 1
        else:
            passed += 1
    return passed, failed, skipped, failures


def fresh(path, start, end=None):
    """Whether path was written at or after start (and by end, when given)."""
    if not os.path.exists(path):
        return False
    m = os.path.getmtime(path)
    return m >= start - SLACK and (end is None or m <= end + SLACK)


def count_lit(build, t):
    """The lit test's cases, from lit.xml when meson's run wrote it."""
    result = t["result"]
    if result == "SKIP":
        return 0, 0, 1, []
    xml = os.path.join(build, "tests", "lit.xml")
    start = t.get("starttime")
    ok = result in ("OK", "EXPECTEDFAIL")
    report = None
    if start is not None and fresh(xml, start, start + (t.get("duration") or 0)):
        report = count_junit(xml, "lit")
    if report is None:
        why = "no lit.xml from this run" if start is not None else "no start time in meson's log"
        return 0, 1, 0, ["%s (%s; %s)" % (t["name"], result, why)]
    p, f, s, failures = report
    if not ok and f == 0:
        f, failures = 1, ["%s (%s, and lit.xml lists no failure)" % (t["name"], result)]
    if ok and p + f == 0:
        f, failures = 1, ["%s (%s, and lit.xml lists no test)" % (t["name"], result)]
    return p, f, s, failures


def count_pytest(build):
    """pytest.xml's tests, checked against pytest.rc when ./setup.sh wrote one."""
    xml = os.path.join(build, "pytest.xml")
    rcfile = os.path.join(build, "pytest.rc")
    if not os.path.exists(rcfile):
        if not os.path.exists(xml):
            return 0, 0, 0, []  # pytest did not run here
        report = count_junit(xml, "pytest")
        return report if report else (0, 1, 0, ["pytest: %s cannot be read" % xml])
    try:
        rc_text, start_text = open(rcfile).read().split()[:2]
        rc, start = int(rc_text), float(start_text)
    except (ValueError, OSError):
        return 0, 1, 0, ["pytest: %s is not 'EXIT START'" % rcfile]
    report = count_junit(xml, "pytest") if fresh(xml, start) else None
    if report is None:
        why = "stale" if os.path.exists(xml) else "none"
        return 0, 1, 0, ["pytest: exited %d with no report from this run (pytest.xml: %s)" % (rc, why)]
    p, f, s, failures = report
    if rc != 0 and f == 0:
        f, failures = 1, ["pytest: exited %d, and pytest.xml lists no failure" % rc]
    return p, f, s, failures


def count(build):
    passed = failed = skipped = 0
    failures = []
    fuzz = os.path.join(build, "fuzz.txt")
    if os.path.exists(fuzz) and not os.path.exists(os.path.join(build, "meson-logs")):
        return count_fuzz(fuzz)
    log = os.path.join(build, "meson-logs", "testlog.json")
    if not os.path.exists(log):
        return 0, 1, 0, ["%s: no test log (did meson test run?)" % build]
    parts = []
    for line in open(log, encoding="utf-8"):
        t = json.loads(line)
        name, result = t["name"], t["result"]
        if name == "lit" or name.endswith("/ lit"):
            parts.append(count_lit(build, t))
        elif result in ("OK", "EXPECTEDFAIL"):
            parts.append((1, 0, 0, []))
        elif result == "SKIP":
            parts.append((0, 0, 1, []))
        else:
            parts.append((0, 1, 0, ["%s (%s)" % (name, result)]))
    parts.append(count_pytest(build))
    for p, f, s, fl in parts:
        passed, failed, skipped = passed + p, failed + f, skipped + s
        failures += fl
    return passed, failed, skipped, failures


def skip_reasons(build):
    """Why each skipped test was skipped: [reason], one per skip: a meson
    test's name (it exited 77: its log says why), a lit or pytest case's
    own message (pytest's "Skipped: no CUDA device", without the prefix)."""
    out = []
    log = os.path.join(build, "meson-logs", "testlog.json")
    if os.path.exists(log):
        for line in open(log, encoding="utf-8"):
            t = json.loads(line)
            if t["result"] == "SKIP":
                out.append("meson test %s (exit 77: its log says why)" % t["name"])
    for xml, prefix in ((os.path.join(build, "tests", "lit.xml"), "lit"), (os.path.join(build, "pytest.xml"),
                                                                           "pytest")):
        try:
            root = ET.parse(xml).getroot()
        except (ET.ParseError, OSError):
            continue
        for case in root.iter("testcase"):
            sk = case.find("skipped")
            if sk is not None and case.find("failure") is None and case.find("error") is None:
                why = (sk.get("message") or sk.text or "no reason given").strip()
                if why.startswith("Skipped: "):
                    why = why[len("Skipped: "):]
                out.append("%s: %s" % (prefix, why.splitlines()[0] if why else "no reason given"))
    return out


def main():
    total_p = total_f = total_s = 0
    for build in sys.argv[1:]:
        p, f, s, failures = count(build)
        for x in failures:
            print("FAILED: %s: %s" % (build, x))
        if s:
            reasons = {}
            for r in skip_reasons(build):
                reasons[r] = reasons.get(r, 0) + 1
            for r, k in sorted(reasons.items(), key=lambda x: -x[1]):
                print("skipped in %s: %d x %s" % (build, k, r))
        print("%s: %d passed, %d failed, %d skipped" % (build, p, f, s))
        total_p, total_f, total_s = total_p + p, total_f + f, total_s + s
    print("tests: %d passed, %d failed" % (total_p, total_f))
    return 1 if total_f else 0


if __name__ == "__main__":
    sys.exit(main())
