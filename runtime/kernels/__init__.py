"""Support for compiled code: generated modules and the Numba cache, SIMD vectors, vector
math, operand layouts, finiteness scans, device-array recognition."""
