"""optc: fused optimizer steps whose results are torch.optim's own bits.

    import optc.torch
    opt = optc.torch.AdamW(model.parameters(), lr=1e-4)   # a torch.optim.Optimizer
    ...
    loss.backward()
    opt.step()                                            # or opt.fused_step(grad_scale=..., max_norm=1.0)

`optc.torch` holds the optimizers (AdamW, Adam, SGD, Adagrad, RMSprop,
Lion); `optc._capi` the ctypes bindings of liboptc's C API (include/optc.h);
`python -m optc.bench` times them against torch.optim.

The library is loaded on import: from $OPTC_LIBRARY if it is set, else from
this package's directory (liboptc.so.0 or liboptc.so, as `pip install`
lays it out), else from a build/ directory above it (a source tree).
"""
from . import _capi
from ._capi import BackendError, InvalidError, NonfiniteError, OptcError

__version__ = "0.2.0"
#: the version liboptc reports (optc_version())
library_version = _capi.version
#: the path of the liboptc shared library in use
library_path = _capi.library_path
#: the loaded ctypes.CDLL
library = _capi.lib

__all__ = ["__version__", "library_version", "library_path", "library", "OptcError", "InvalidError",
           "BackendError", "NonfiniteError"]
