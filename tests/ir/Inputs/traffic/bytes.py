"""Prints `name phases bytes [per-phase bytes]` for each recipe in a folder,
from optc --emit=plan --json, in the order traffic.test lists them."""
import json
import subprocess
import sys

optc, folder = sys.argv[1], sys.argv[2]
ORDER = ["adamw_fp32", "adamw_fp32_clip", "adamw_bf16", "adamw_bf16_fp32states", "adamw_bf16_clip",
         "adamw_fp32_keepgrads", "adam_amsgrad", "sgd", "sgd_momentum", "lion", "adagrad", "rmsprop",
         "rmsprop_centered_momentum", "adamw8bit_bf16", "adamw8bit_fp32_clip", "adamw8bit_amsgrad", "adamw4bit_bf16",
         "adamw4bit_block64", "adamw_lowbit_plain_bf16"]
for name in ORDER:
    out = subprocess.run([optc, "--emit=plan", "--json", "%s/%s.yaml" % (folder, name)],
                         check=True, capture_output=True, text=True).stdout
    plan = json.loads(out)
    phases = plan["phases"]
    assert sum(p["bytes_per_element"] for p in phases) == plan["bytes_per_element"]
    for p in phases:
        assert p["bytes_per_element"] == sum(b["bytes"] for b in p["reads"] + p["writes"])
    per = " [" + ", ".join("%g" % p["bytes_per_element"] for p in phases) + "]" if len(phases) > 1 else ""
    print("%-28s %d %g%s" % (name, len(phases), plan["bytes_per_element"], per))
