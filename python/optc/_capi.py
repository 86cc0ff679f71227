"""ctypes bindings of liboptc's public C API (include/optc.h), one for one.

Every struct and function of optc.h is declared here with its C types. On
top of the raw bindings sit a few thin helpers that the torch layer uses:
`check` turns an optc_status into a Python exception carrying optc's
message, `Step` owns one optc_step (built from a spec, freed with the
object) and runs it.

Errors: OPTC_ERR_INVALID and OPTC_ERR_SPEC raise InvalidError (a
ValueError), OPTC_ERR_NONFINITE raises NonfiniteError (a
FloatingPointError), the others raise BackendError (a RuntimeError). All
three are OptcError, with the status in `.code`.

The library is found, in order: $OPTC_LIBRARY (a path to the .so); the
package directory (the installed layout: liboptc.so.0, liboptc.so or
liboptc.so.X.Y.Z next to __init__.py); a build/ directory found by walking up from the package
directory (the source tree, after meson compiles into build/).

NVRTC, which only CUDA steps need, is opened by liboptc when the first one
is built. On import this module gives it the lib folders of the NVIDIA
wheels in this environment (`nvidia_lib_dirs`: torch's CUDA build installs
NVRTC there) to look in before $CUDA_HOME and the system; `nvrtc_info()`
says which NVRTC it found, or why there is none.
"""
import ctypes
import glob
import importlib.util
import os
import re
import time

# ---- the library ---------------------------------------------------------------------------

_HERE = os.path.dirname(os.path.abspath(__file__))
_NAMES = ("liboptc.so.0", "liboptc.so")


def _candidates():
    env = os.environ.get("OPTC_LIBRARY")
    if env:
        return [env], True
    out = [os.path.join(_HERE, n) for n in _NAMES] + sorted(glob.glob(os.path.join(_HERE, "liboptc.so.*")))
    d = _HERE
    while True:
        build = os.path.join(d, "build")
        out += [os.path.join(build, n) for n in _NAMES]
        out += sorted(glob.glob(os.path.join(build, "liboptc.so.*")))
        parent = os.path.dirname(d)
        if parent == d:
            break
        d = parent
    seen = set()
    out = [p for p in out if not (p in seen or seen.add(p)) and not p.endswith(".p")]
    return out, False


def _load():
    paths, from_env = _candidates()
    errors = []
    for p in paths:
        if not from_env and not os.path.isfile(p):
            continue
        try:
            return ctypes.CDLL(p), os.path.abspath(p)
        except OSError as e:
            errors.append(f"{p}: {e}")
            if from_env:
                break
    where = "$OPTC_LIBRARY=" + paths[0] if from_env else "next to the package or in a build/ directory above it"
    detail = ("; " + "; ".join(errors)) if errors else ""
    raise ImportError(f"optc: cannot load liboptc ({where}){detail}. Install the package (pip install .), "
                      f"build the library into build/, or set OPTC_LIBRARY to liboptc.so's path")


lib, library_path = _load()

# ---- enums ---------------------------------------------------------------------------------

OPTC_OK = 0
OPTC_ERR_INVALID = 1
OPTC_ERR_SPEC = 2
OPTC_ERR_COMPILE = 3
OPTC_ERR_DEVICE = 4
OPTC_ERR_NONFINITE = 5
STATUS_NAMES = {0: "OPTC_OK", 1: "OPTC_ERR_INVALID", 2: "OPTC_ERR_SPEC", 3: "OPTC_ERR_COMPILE",
                4: "OPTC_ERR_DEVICE", 5: "OPTC_ERR_NONFINITE"}

OPTC_F32, OPTC_BF16, OPTC_F16, OPTC_U8, OPTC_U4 = 0, 1, 2, 3, 4
DTYPE_NAMES = {OPTC_F32: "f32", OPTC_BF16: "bf16", OPTC_F16: "f16", OPTC_U8: "8-bit", OPTC_U4: "4-bit"}
DTYPE_SIZE = {OPTC_F32: 4, OPTC_BF16: 2, OPTC_F16: 2}

OPTC_TARGET_CPU, OPTC_TARGET_CUDA = 0, 1

OPTC_NONFINITE_PROPAGATE, OPTC_NONFINITE_SKIP, OPTC_NONFINITE_ERROR = 0, 1, 2

OPTC_CLIP_NONE, OPTC_CLIP_NORM, OPTC_CLIP_GIVEN = 0, 1, 2

OPTC_INIT_ZERO, OPTC_INIT_VALUE, OPTC_INIT_PARAM = 0, 1, 2

OPTC_ERROR_MESSAGE_LEN = 4096

# ---- structs -------------------------------------------------------------------------------


class optc_error(ctypes.Structure):
    _fields_ = [("code", ctypes.c_int), ("message", ctypes.c_char * OPTC_ERROR_MESSAGE_LEN)]


class optc_scalar(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("value", ctypes.c_double)]


class optc_spec(ctypes.Structure):
    _fields_ = [
        ("optimizer", ctypes.c_char_p),
        ("param_dtype", ctypes.c_int),
        ("grad_dtype", ctypes.c_int),
        ("state_dtype", ctypes.c_int),
        ("fused", ctypes.c_int),
        ("clip", ctypes.c_int),
        ("write_back_grads", ctypes.c_int),
        ("nonfinite", ctypes.c_int),
        ("torch_cpu", ctypes.c_char_p),
        ("target", ctypes.c_int),
        ("options", ctypes.POINTER(optc_scalar)),
        ("noptions", ctypes.c_int),
    ]


class optc_buffers(ctypes.Structure):
    _fields_ = [
        ("ntensors", ctypes.c_int),
        ("numel", ctypes.POINTER(ctypes.c_int64)),
        ("param", ctypes.POINTER(ctypes.c_void_p)),
        ("grad", ctypes.POINTER(ctypes.c_void_p)),
        ("state", ctypes.POINTER(ctypes.c_void_p)),
        ("stream", ctypes.c_void_p),
    ]


class optc_result(ctypes.Structure):
    _fields_ = [("grad_norm", ctypes.c_double), ("grad_sumsq", ctypes.c_double), ("skipped", ctypes.c_int)]


# ---- functions -----------------------------------------------------------------------------

_step_p = ctypes.c_void_p
_err_p = ctypes.POINTER(optc_error)


def _bind(name, restype, *argtypes):
    try:
        f = getattr(lib, name)
    except AttributeError:
        raise ImportError(f"optc: {library_path} has no {name}: it does not match this package's optc.h") from None
    f.restype = restype
    f.argtypes = list(argtypes)
    return f


optc_version = _bind("optc_version", ctypes.c_char_p)
optc_spec_default = _bind("optc_spec_default", optc_spec, ctypes.c_char_p)
optc_step_new = _bind("optc_step_new", ctypes.c_int, ctypes.POINTER(optc_spec), ctypes.POINTER(_step_p), _err_p)
optc_step_from_recipe = _bind("optc_step_from_recipe", ctypes.c_int, ctypes.c_char_p, ctypes.c_char_p,
                              ctypes.POINTER(ctypes.c_char_p), ctypes.c_int, ctypes.c_int,
                              ctypes.POINTER(_step_p), _err_p)
optc_step_free = _bind("optc_step_free", None, _step_p)
optc_step_num_states = _bind("optc_step_num_states", ctypes.c_int, _step_p)
optc_step_state_name = _bind("optc_step_state_name", ctypes.c_char_p, _step_p, ctypes.c_int)
optc_step_state_dtype = _bind("optc_step_state_dtype", ctypes.c_int, _step_p, ctypes.c_int)
optc_step_state_init = _bind("optc_step_state_init", ctypes.c_int, _step_p, ctypes.c_int,
                             ctypes.POINTER(ctypes.c_double))
optc_step_num_scalars = _bind("optc_step_num_scalars", ctypes.c_int, _step_p)
optc_step_scalar_name = _bind("optc_step_scalar_name", ctypes.c_char_p, _step_p, ctypes.c_int,
                              ctypes.POINTER(ctypes.c_double))
optc_step_bytes_per_element = _bind("optc_step_bytes_per_element", ctypes.c_int, _step_p)
optc_step_traffic = _bind("optc_step_traffic", ctypes.c_double, _step_p)
optc_step_state_block = _bind("optc_step_state_block", ctypes.c_int, _step_p, ctypes.c_int)
optc_step_state_bytes = _bind("optc_step_state_bytes", ctypes.c_int64, _step_p, ctypes.c_int, ctypes.c_int64)
optc_step_align = _bind("optc_step_align", ctypes.c_int, _step_p)
optc_code_book = _bind("optc_code_book", ctypes.c_int, ctypes.c_char_p, ctypes.POINTER(ctypes.c_float))
optc_step_ir = _bind("optc_step_ir", ctypes.c_char_p, _step_p)
optc_step_plan = _bind("optc_step_plan", ctypes.c_char_p, _step_p)
optc_step_run = _bind("optc_step_run", ctypes.c_int, _step_p, ctypes.POINTER(optc_buffers),
                      ctypes.POINTER(optc_scalar), ctypes.c_int, ctypes.c_int, ctypes.POINTER(optc_result), _err_p)

optc_torch_sqrt = _bind("optc_torch_sqrt", ctypes.c_int, ctypes.c_char_p, ctypes.POINTER(ctypes.c_float),
                        ctypes.POINTER(ctypes.c_float), ctypes.c_int64, _err_p)
optc_nvrtc_dirs = _bind("optc_nvrtc_dirs", ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)
optc_nvrtc_info = _bind("optc_nvrtc_info", ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t)

version = optc_version().decode()

# ---- NVRTC ---------------------------------------------------------------------------------


def nvidia_lib_dirs():
    """The lib folders of this environment's NVIDIA wheels that may hold
    NVRTC, newest CUDA first: nvidia/cu13/lib (CUDA 13's
    nvidia-cuda-nvrtc), nvidia/cuda_nvrtc/lib (CUDA 12's
    nvidia-cuda-nvrtc-cu12). Found without importing torch."""
    try:
        spec = importlib.util.find_spec("nvidia")
    except (ImportError, ValueError):
        return []
    roots = list(spec.submodule_search_locations or []) if spec else []
    out = []
    for root in roots:
        cus = glob.glob(os.path.join(root, "cu[0-9]*", "lib"))
        cus.sort(key=lambda d: -int(re.sub(r"\D", "", os.path.basename(os.path.dirname(d))) or 0))
        for d in cus + [os.path.join(root, "cuda_nvrtc", "lib")]:
            if os.path.isdir(d) and d not in out:
                out.append(d)
    return out


def nvrtc_info():
    """(found, line): whether liboptc has NVRTC for CUDA steps, and
    "NVRTC 13.0 (its path)" or why not. Looks for it if no CUDA step has."""
    buf = ctypes.create_string_buffer(2048)
    ok = optc_nvrtc_info(buf, len(buf))
    return bool(ok), buf.value.decode(errors="replace")


# Before anything looks for NVRTC; a second copy of this module over the same
# liboptc finds it given already.
optc_nvrtc_dirs(os.pathsep.join(nvidia_lib_dirs()).encode(), None)

# ---- errors --------------------------------------------------------------------------------


class OptcError(Exception):
    """An error liboptc reported; `.code` is its optc_status."""

    def __init__(self, message, code):
        super().__init__(message)
        self.code = code


class InvalidError(OptcError, ValueError):
    """OPTC_ERR_INVALID or OPTC_ERR_SPEC: a bad argument, or a spec that makes no step."""


class BackendError(OptcError, RuntimeError):
    """OPTC_ERR_COMPILE or OPTC_ERR_DEVICE: the backend could not compile or run it."""


class NonfiniteError(OptcError, FloatingPointError):
    """OPTC_ERR_NONFINITE: non-finite grads with nonfinite = error; nothing was changed."""


def error_for(code, message):
    cls = {OPTC_ERR_INVALID: InvalidError, OPTC_ERR_SPEC: InvalidError,
           OPTC_ERR_NONFINITE: NonfiniteError}.get(code, BackendError)
    return cls(message or f"liboptc: {STATUS_NAMES.get(code, code)}", code)


def check(status, err, what=""):
    """Raises the exception for a failed call; `what` prefixes the message."""
    if status != OPTC_OK:
        msg = err.message.decode(errors="replace")
        raise error_for(status, f"{what}: {msg}" if what else msg)


def code_book(name):
    """A code book's entries (dyn8s, dyn8u, dyn4s, lin4u, lin8s, lin8u), as a
    list of floats: what optc's quantized states' codes index."""
    n = optc_code_book(name.encode(), None)
    if n == 0:
        raise InvalidError(f"optc: no code book named {name!r}", OPTC_ERR_INVALID)
    v = (ctypes.c_float * n)()
    optc_code_book(name.encode(), v)
    return list(v)


def torch_sqrt(torch_cpu, xs):
    """optc_torch_sqrt: torch.sqrt of these f32 values as optc computes it for
    torch_cpu ("avx512", "avx2", "amd" or None: this CPU's guess); a list."""
    n = len(xs)
    x = (ctypes.c_float * max(1, n))(*xs)
    y = (ctypes.c_float * max(1, n))()
    err = optc_error()
    check(optc_torch_sqrt(torch_cpu.encode() if torch_cpu else None, x, y, n, ctypes.byref(err)), err)
    return list(y[:n])


# ---- a step --------------------------------------------------------------------------------

# optc_step_new calls made in this process (the torch layer's "no recompiles"
# tests read it), and the seconds they took.
step_new_calls = 0
step_new_seconds = 0.0


class Step:
    """One optc_step, freed when the object goes. Build it with Step(spec) or
    Step.from_recipe(...).

    spec: a dict of optc_spec's fields (optimizer, param_dtype, grad_dtype,
    state_dtype, fused, clip, write_back_grads, nonfinite, torch_cpu, target)
    and `options`, a sequence of (name, value) build-time options. Fields
    left out keep optc_spec_default's values.

    After building: .states, [(name, optc dtype, init, value)] in
    optc_buffers.state order (.state_block: each one's block, 0 but for a
    quantized state's scales); .scalars, {name: default} (NaN: must be
    given); .bytes_per_element (the traffic, a fraction with quantized
    states); .ir and .plan (text).
    """

    def __init__(self, spec):
        self._ptr = None
        self.spec = dict(spec)
        name = spec["optimizer"]
        c = optc_spec_default(name.encode())
        for k in ("param_dtype", "grad_dtype", "state_dtype", "fused", "clip", "write_back_grads", "nonfinite",
                  "target"):
            if k in spec:
                setattr(c, k, int(spec[k]))
        keep = [name.encode()]  # the strings and arrays the spec points at, alive for the call
        c.optimizer = keep[0]
        if spec.get("torch_cpu"):
            keep.append(spec["torch_cpu"].encode())
            c.torch_cpu = keep[-1]
        opts = list(spec.get("options", ()))
        if opts:
            arr = (optc_scalar * len(opts))()
            for i, (k, v) in enumerate(opts):
                kb = k.encode()
                keep.append(kb)
                arr[i].name = kb
                arr[i].value = float(v)
            keep.append(arr)
            c.options = arr
            c.noptions = len(opts)
        self._build(lambda ptr, err: optc_step_new(ctypes.byref(c), ctypes.byref(ptr), ctypes.byref(err)))

    @classmethod
    def from_recipe(cls, name, yaml, overrides=(), target=OPTC_TARGET_CPU):
        """optc_step_from_recipe: a torchtune-shaped recipe's text, with
        key=value overrides; `name` is used in messages."""
        self = cls.__new__(cls)
        self._ptr = None
        self.spec = {"recipe": name}
        ov = [o.encode() for o in overrides]
        arr = (ctypes.c_char_p * max(1, len(ov)))(*ov)
        self._build(lambda ptr, err: optc_step_from_recipe(name.encode(), yaml.encode(), arr, len(ov), int(target),
                                                           ctypes.byref(ptr), ctypes.byref(err)))
        return self

    def _build(self, call):
        global step_new_calls, step_new_seconds
        ptr = _step_p()
        err = optc_error()
        t0 = time.perf_counter()
        status = call(ptr, err)
        self.build_seconds = time.perf_counter() - t0
        step_new_seconds += self.build_seconds
        step_new_calls += 1
        check(status, err)
        self._ptr = ptr
        self._free = optc_step_free  # kept for __del__ at interpreter exit
        self.states = []
        self.state_block = []
        for k in range(optc_step_num_states(ptr)):
            v = ctypes.c_double()
            init = optc_step_state_init(ptr, k, ctypes.byref(v))
            self.states.append((optc_step_state_name(ptr, k).decode(), optc_step_state_dtype(ptr, k), init, v.value))
            self.state_block.append(optc_step_state_block(ptr, k))
        self.scalars = {}
        for i in range(optc_step_num_scalars(ptr)):
            d = ctypes.c_double()
            nm = optc_step_scalar_name(ptr, i, ctypes.byref(d)).decode()
            self.scalars[nm] = d.value
        self.bytes_per_element = optc_step_traffic(ptr)
        self._names = {}  # scalar name -> its encoded bytes, alive for the runs

    def __del__(self):
        if getattr(self, "_ptr", None):
            self._free(self._ptr)
            self._ptr = None

    @property
    def ir(self):
        return optc_step_ir(self._ptr).decode()

    @property
    def plan(self):
        return optc_step_plan(self._ptr).decode()

    def run(self, ntensors, numel, param, grad, state, scalars, threads=0, stream=None):
        """Runs the step in place. numel, param, grad and state are ctypes
        arrays (int64, void*, void*, void*) in optc_buffers' layout; scalars
        a dict name -> value, every name one the step declares (.scalars);
        stream a CUstream (an int) or None; returns the optc_result."""
        b = optc_buffers(ntensors, numel, param, grad, state, stream)
        names = self._names
        arr = (optc_scalar * max(1, len(scalars)))()
        for i, (k, v) in enumerate(scalars.items()):
            kb = names.get(k)
            if kb is None:
                kb = names[k] = k.encode()
            arr[i].name = kb
            arr[i].value = v
        res = optc_result()
        err = optc_error()
        status = optc_step_run(self._ptr, ctypes.byref(b), arr, len(scalars), int(threads), ctypes.byref(res),
                               ctypes.byref(err))
        check(status, err)
        return res
