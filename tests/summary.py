#!/usr/bin/env python3
"""Counts test results from one or more meson build directories.

Each meson test counts once, except the lit suite, whose individual test
files are counted from its xunit report; a build directory's pytest.xml
(the pytest suite's junit report, which ./setup.sh test writes) adds each
pytest test. A directory with fuzz.txt and no meson logs (build-fuzz, from
.ci/run) counts each fuzz target and each failed reproducer replay. Prints one line per build directory, and last, the line CI
reads:  tests: N passed, M failed
Exits non-zero if anything failed.

usage: summary.py BUILD_DIR [BUILD_DIR ...]
"""
import json
import os
import sys
import xml.etree.ElementTree as ET


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


def count(build):
    passed = failed = skipped = 0
    failures = []
    fuzz = os.path.join(build, "fuzz.txt")
    if os.path.exists(fuzz) and not os.path.exists(os.path.join(build, "meson-logs")):
        return count_fuzz(fuzz)
    log = os.path.join(build, "meson-logs", "testlog.json")
    if not os.path.exists(log):
        return 0, 1, 0, ["%s: no test log (did meson test run?)" % build]
    for line in open(log, encoding="utf-8"):
        t = json.loads(line)
        name, result = t["name"], t["result"]
        if name == "lit" or name.endswith("/ lit"):
            xml = os.path.join(build, "tests", "lit.xml")
            if result in ("OK", "FAIL") and os.path.exists(xml):
                for case in ET.parse(xml).getroot().iter("testcase"):
                    if case.find("failure") is not None or case.find("error") is not None:
                        failed += 1
                        failures.append("lit: " + case.get("name", "?"))
                    elif case.find("skipped") is not None:
                        skipped += 1
                    else:
                        passed += 1
                continue
        if result in ("OK", "EXPECTEDFAIL"):
            passed += 1
        elif result == "SKIP":
            skipped += 1
        else:
            failed += 1
            failures.append("%s (%s)" % (name, result))
    pytest_xml = os.path.join(build, "pytest.xml")
    if os.path.exists(pytest_xml):
        for case in ET.parse(pytest_xml).getroot().iter("testcase"):
            name = "pytest: %s::%s" % (case.get("classname", "?"), case.get("name", "?"))
            if case.find("failure") is not None or case.find("error") is not None:
                failed += 1
                failures.append(name)
            elif case.find("skipped") is not None:
                skipped += 1
            else:
                passed += 1
    return passed, failed, skipped, failures


def main():
    total_p = total_f = total_s = 0
    for build in sys.argv[1:]:
        p, f, s, failures = count(build)
        for x in failures:
            print("FAILED: %s: %s" % (build, x))
        print("%s: %d passed, %d failed, %d skipped" % (build, p, f, s))
        total_p, total_f, total_s = total_p + p, total_f + f, total_s + s
    print("tests: %d passed, %d failed" % (total_p, total_f))
    return 1 if total_f else 0


if __name__ == "__main__":
    sys.exit(main())
