"""What tests/wheel.sh runs in the fresh venv, one mode a process.

  wheel_check.py clash SITE README LIB...   LIB... (other LLVMs) loaded RTLD_GLOBAL first; CPU steps
  wheel_check.py hidden SITE README DEV_LIB  LLVM, libyaml, jansson and the toolkit hidden (wheel.sh):
                                             DEV_LIB (a liboptc that needs libLLVM, or -) does not load;
                                             the README's example; a CUDA step built with torch's NVRTC
  wheel_check.py no-nvrtc SITE               NVRTC hidden too: a CPU step, and the CUDA step's one line

SITE is the fresh venv's site-packages, where optc must come from.
"""
import ctypes
import os
import re
import subprocess
import sys
import time


def check(cond, what):
    if not cond:
        print(f"wheel_check.py: FAIL: {what}", file=sys.stderr)
        sys.exit(1)


def import_optc(site, with_torch=True):
    t0 = time.perf_counter()
    import optc
    if with_torch:
        import optc.torch  # noqa: F401
    where = os.path.dirname(optc.__file__)
    check(where == os.path.join(site, "optc"), f"optc imported from {where}, not the wheel's {site}/optc")
    check(optc.library_path.startswith(where + os.sep), f"liboptc loaded from {optc.library_path}")
    print(f"optc {optc.__version__} from {where} ({time.perf_counter() - t0:.2f} s to import)")
    return optc


def readme_example(readme):
    """The README's PyTorch example, as it is written there."""
    m = re.search(r"```python\n(import torch, optc\.torch\n.*?)```", open(readme).read(), re.S)
    check(m, f"no example starting 'import torch, optc.torch' in {readme}")
    t0 = time.perf_counter()
    exec(compile(m.group(1), "README.md", "exec"), {})
    print(f"the README's example: {time.perf_counter() - t0:.2f} s")


def adamw_step():
    """One optc.torch.AdamW step (compile included: OPTC_CACHE=0) beside torch.optim.AdamW's."""
    import torch
    import optc.torch
    torch.manual_seed(0)
    p = torch.randn(4096, requires_grad=True)
    q = p.detach().clone().requires_grad_(True)
    p.grad = torch.randn(4096)
    q.grad = p.grad.clone()
    opt = optc.torch.AdamW([p], lr=1e-3, weight_decay=0.01)
    t0 = time.perf_counter()
    opt.step()
    first = time.perf_counter() - t0
    torch.optim.AdamW([q], lr=1e-3, weight_decay=0.01).step()
    diff = (p - q).abs().max().item()
    check(diff <= 1e-6, f"optc's AdamW step differs from torch's by {diff}")
    print(f"optc.torch.AdamW: first step {first * 1e3:.0f} ms (compile included), within {diff:.1e} of torch's")


def capi_cpu_step(optc):
    """AdamW on 1000 elements through the C API, against its first step by hand."""
    c = optc._capi
    s = c.Step({"optimizer": "adamw", "options": [("weight_decay", 0.01)]})
    n = 1000
    P = (ctypes.c_float * n)(*[1.0] * n)
    G = (ctypes.c_float * n)(*[0.5] * n)
    st = [(ctypes.c_float * n)() for _ in s.states]
    ptr = lambda xs: (ctypes.c_void_p * len(xs))(*[ctypes.addressof(x) for x in xs])
    s.run(1, (ctypes.c_int64 * 1)(n), ptr([P]), ptr([G]), ptr(st), {"lr": 1e-3, "step": 1})
    # step 1: m_hat = g, v_hat = g^2, so p <- p (1 - lr wd) - lr g / (|g| + eps)
    want = 1.0 * (1 - 1e-3 * 0.01) - 1e-3 * 0.5 / (0.5 + 1e-8)
    check(all(abs(P[i] - want) < 1e-6 for i in range(n)), f"CPU step: {P[0]}, expected {want}")
    print(f"CPU step through the C API: {P[0]:.8f}, as expected")


def cuda_step(optc):
    c = optc._capi
    return c.Step({"optimizer": "adamw", "target": c.OPTC_TARGET_CUDA})


def main():
    mode, site = sys.argv[1], sys.argv[2]
    if mode == "clash":
        # RTLD_GLOBAL: their symbols first in the global scope, where an
        # exported symbol of optc's would bind to them. (torch is left out:
        # its own step crashes with Debian's libLLVM loaded so.)
        others = [ctypes.CDLL(lib, mode=ctypes.RTLD_GLOBAL) for lib in sys.argv[4:]]
        optc = import_optc(site, with_torch=False)
        for lib, other in zip(sys.argv[4:], others):
            other.LLVMContextCreate.restype = ctypes.c_void_p
            other.LLVMContextDispose.argtypes = [ctypes.c_void_p]
            capi_cpu_step(optc)
            other.LLVMContextDispose(other.LLVMContextCreate())
            print(f"... beside {lib} (RTLD_GLOBAL), which works too")
    elif mode == "hidden":
        readme, dev = sys.argv[3], sys.argv[4]
        for name in ("libLLVM.so.19.1", "libLLVM-19.so", "libyaml-0.so.2", "libjansson.so.4"):
            try:
                ctypes.CDLL(name)
                check(False, f"{name} still loads: not hidden")
            except OSError:
                pass
        if dev != "-":  # the dev build's liboptc, which needs the shared libLLVM (wheel.sh checked)
            try:
                ctypes.CDLL(dev)
                check(False, f"the dev build's {dev} loads: its libraries are not hidden")
            except OSError as e:
                print(f"the dev build's liboptc cannot load here: {e}")
        optc = import_optc(site)
        readme_example(readme)
        adamw_step()
        ok, line = optc._capi.nvrtc_info()
        dirs = optc._capi.nvidia_lib_dirs()
        check(ok and any(line.endswith(f"({d}/libnvrtc.so.13)") or line.endswith(f"({d}/libnvrtc.so.12)")
                         for d in dirs), f"NVRTC not from torch's wheels ({dirs}): {line}")
        t0 = time.perf_counter()
        cuda_step(optc)
        print(f"{line}: a CUDA step built in {time.perf_counter() - t0:.2f} s, no toolkit header anywhere")
    elif mode == "no-nvrtc":
        r = subprocess.run([sys.executable, "-c", "import torch"], capture_output=True, text=True)
        check(r.returncode != 0 and "libnvrtc" in r.stderr, "torch's CUDA build imports: its NVRTC is not hidden")
        print("torch's CUDA build cannot load here (it needs libnvrtc itself); optc alone:")
        optc = import_optc(site, with_torch=False)
        capi_cpu_step(optc)
        dirs = optc._capi.nvidia_lib_dirs() + ["/usr/local/cuda/lib64"]
        want = (f"NVRTC not found: no libnvrtc.so.13 or .12 in {', '.join(dirs)} or on the loader's path; install "
                "torch's CUDA build (its nvidia wheels carry NVRTC) or the CUDA toolkit, or set OPTC_NVRTC to a "
                "libnvrtc.so")
        ok, line = optc._capi.nvrtc_info()
        check(not ok and line == want, f"nvrtc_info: {ok}, {line!r}; expected {want!r}")
        try:
            cuda_step(optc)
            check(False, "a CUDA step was built without NVRTC")
        except optc.BackendError as e:
            check(str(e) == "optc: error: CUDA: " + want, f"the CUDA step's error: {str(e)!r}")
            print(f"a CUDA step: {e}")
    else:
        check(False, f"unknown mode {mode}")


main()
