"""Scratch: does cython_blas sgemm inside prange pay, and how do OpenBLAS threads interact?"""
import ctypes, os, sys, time
import numpy as np
from numba import njit, prange
from numba.extending import get_cython_function_address

P = ctypes.c_void_p
addr = get_cython_function_address("scipy.linalg.cython_blas", "sgemm")
sgemm = ctypes.CFUNCTYPE(None, P, P, P, P, P, P, P, P, P, P, P, P, P)(addr)
lib = ctypes.CDLL([p for p in __import__("glob").glob(os.path.dirname(__import__("scipy").__file__) + ".libs/libscipy_openblas*.so")][0])
set_local = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int)(ctypes.cast(lib.openblas_set_num_threads_local, P).value)

@njit(cache=True, parallel=True)
def gemm_silu(a, b, out, tm, mode):
    # a[m,k] row-major, b[n,k] row-major (b is A of the seed, we need a @ b.T); out[m,n]
    m, k = a.shape
    n = b.shape[0]
    ntiles = (m + tm - 1) // tm
    for t in prange(ntiles):
        if mode == 1:
            set_local(1)
        i0 = t * tm
        rows = min(tm, m - i0)
        scratch = np.empty((tm, n), np.float32)
        prm = np.empty(6, np.int32)
        prm[0] = n; prm[1] = rows; prm[2] = k; prm[3] = k; prm[4] = k; prm[5] = n
        ch = np.empty(2, np.uint8); ch[0] = ord('T'); ch[1] = ord('N')
        sc = np.empty(2, np.float32); sc[0] = 1.0; sc[1] = 0.0
        # column-major: C^T[n, rows] = B^T... b row-major [n,k] is col-major [k,n] -> op T gives [n,k]
        sgemm(ch[0:].ctypes.data, ch[1:].ctypes.data, prm[0:].ctypes.data, prm[1:].ctypes.data,
              prm[2:].ctypes.data, sc[0:].ctypes.data, b.ctypes.data, prm[3:].ctypes.data,
              a[i0:].ctypes.data, prm[4:].ctypes.data, sc[1:].ctypes.data, scratch.ctypes.data,
              prm[5:].ctypes.data)
        for i in range(rows):
            for j in range(n):
                v = scratch[i, j]
                out[i0 + i, j] = v / (np.float32(1.0) + np.exp(-v))
    return out

def bench(f, reps=30):
    f(); ts = []
    for _ in range(reps):
        t = time.perf_counter(); f(); ts.append(time.perf_counter() - t)
    return np.median(ts) * 1e3

if __name__ == "__main__":
    T = int(sys.argv[1]) if len(sys.argv) > 1 else 8192
    mode = int(sys.argv[2]) if len(sys.argv) > 2 else 0
    if mode == 2:
        lib.scipy_openblas_set_num_threads(1)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((T, 1024), np.float32); A = rng.standard_normal((32, 1024), np.float32)
    out = np.empty((T, 32), np.float32)
    ref = x @ A.T; ref = ref / (1 + np.exp(-ref))
    for tm in (64, 256, 1024):
        gemm_silu(x, A, out, tm, mode)
        assert np.allclose(out, ref, rtol=1e-4, atol=1e-3)
        print(f"T={T} mode={mode} tm={tm}: {bench(lambda: gemm_silu(x, A, out, tm, mode)):.3f} ms")
    print("numpy matmul+silu", bench(lambda: (lambda r: r / (1 + np.exp(-r)))(x @ A.T)))
