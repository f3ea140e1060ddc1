"""The built-in atoms' CUDA kernels: plain modules of module-level ``@cuda.jit`` functions, one
per atom module (``atoms.window`` -> ``atoms.cuda.window``), nothing generated at run time.

Only a CUDA kernel factory imports them (a function-level import), so ``import atoms`` never
loads numba.cuda. Importing this package first points Numba's disk cache at the runtime's
(``configure_numba_cache``), before any ``cache=True`` kernel below is defined.
"""
from runtime.toolkit import configure_numba_cache

configure_numba_cache()
