"""Every module of the Python package is installed: meson.build lists each
file of python/optc/ that `pip install .` (meson-python) puts in the
package, and a file it misses is an ImportError only after install."""
import glob
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_meson_installs_every_module():
    text = open(os.path.join(ROOT, "meson.build")).read()
    listed = set(re.findall(r"'(python/optc/[^']+\.py)'", text))
    have = {os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "python", "optc", "**", "*.py"),
                                                          recursive=True)}
    assert have - listed == set(), f"in python/optc but not installed by meson.build: {sorted(have - listed)}"
    assert listed - have == set(), f"listed in meson.build but not in python/optc: {sorted(listed - have)}"
