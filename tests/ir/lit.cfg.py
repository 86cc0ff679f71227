# lit configuration for optc's text tests: *.optir step graphs, *.test
# command scripts and *.yaml recipes, each with `# RUN:` and `# CHECK:` lines.
import os

import lit.formats

config.name = "optc"
config.test_format = lit.formats.ShTest(execute_external=False)
config.suffixes = [".optir", ".test", ".yaml"]
config.test_source_root = os.path.dirname(__file__)
config.excludes = ["Inputs", "lit.cfg.py"]
if "builddir" in lit_config.params:
    config.test_exec_root = lit_config.params["builddir"]

params = lit_config.params
for key in ("optc", "filecheck", "not", "root", "python"):
    if key not in params:
        lit_config.fatal("missing --param %s=..." % key)

config.substitutions.append(("%optc", params["optc"]))
config.substitutions.append(("%root", params["root"]))
config.substitutions.append(("%FileCheck", params["filecheck"]))
config.substitutions.append(("%not", params["not"]))
config.substitutions.append(("%python", params["python"]))
config.substitutions.append(("%tensor_diff", params.get("tensor_diff", "tensor_diff")))
config.substitutions.append(("%mkst", "%s %s" % (params.get("python", "python3"),
                                                  os.path.join(params["root"], "tests", "mkst.py"))))
config.environment["OPTC_CACHE"] = "0"

# `REQUIRES: avx512f`: what the host CPU backend compiles for has AVX-512F
# (optc without --cpu emits for the host's own features).
try:
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("flags"):
                if "avx512f" in line.split(":", 1)[1].split():
                    config.available_features.add("avx512f")
                break
except OSError:
    pass
