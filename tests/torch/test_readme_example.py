"""The README's "Use it from PyTorch" example runs as it is written.

The example is taken from README.md (the first ```python block of that
section) and run in a fresh interpreter with the optc package this suite
uses; it must train (a finite loss below the first step's) and print its
line. So the README cannot drift from the package.
"""
import os
import re
import subprocess
import sys

from conftest import ROOT


def readme_example():
    text = open(os.path.join(ROOT, "README.md")).read()
    section = text.split("## Use it from PyTorch", 1)[1].split("\n## ", 1)[0]
    m = re.search(r"```python\n(.*?)```", section, re.S)
    assert m, "README.md: no python example under 'Use it from PyTorch'"
    return m.group(1)


def test_readme_example(tmp_path):
    code = readme_example()
    # the first loss too, to see it train
    probe = code.replace("for step in range(100):", "first = None\nfor step in range(100):") \
                .replace("    opt.zero_grad();", "    first = first if first is not None else loss.item()\n    opt.zero_grad();")
    probe += "\nassert loss.item() < first, (first, loss.item())\n"
    script = tmp_path / "example.py"
    script.write_text(probe)
    env = dict(os.environ)
    if "OPTC_LIBRARY" in env:  # a source tree: the package from python/
        env["PYTHONPATH"] = os.path.join(ROOT, "python") + os.pathsep + env.get("PYTHONPATH", "")
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, cwd=tmp_path,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    assert re.match(r"loss \d+\.\d{4}, grad norm \d+\.\d{4}\n", r.stdout), r.stdout
