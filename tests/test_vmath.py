"""runtime.kernels.vmath: the vectorisable exp, erf and tanh that CPU kernels use in place of libm's."""
import math

import numpy as np
import pytest
from numba import njit

from runtime.kernels import vmath
from runtime.kernels.vmath import verf, vexp, vtanh


def _over_all(fn):
    """A compiled loop ``out[i] = fn(x[i])``, with the generated kernels' error model (a
    division that may raise would keep the loop scalar)."""
    @njit(error_model="numpy")
    def run(x, out):
        for i in range(x.size):
            out[i] = fn(x[i])
    return run


_exp_all = _over_all(vexp)


def _vexp(x):
    out = np.empty_like(x)
    _exp_all(x, out)
    return out


def test_vexp_is_within_two_ulp_of_libm_over_the_normal_range():
    rng = np.random.default_rng(0)
    x = np.concatenate([np.linspace(-708.3, 709.78, 400_001), rng.standard_normal(200_000) * 4,
                        rng.uniform(-1e-8, 1e-8, 1000), [0.0, -0.0, 1.0, -1.0, 709.78, -708.29]])
    want = np.exp(x)
    got = _vexp(x)
    ulp = np.spacing(want)
    assert np.max(np.abs(got - want) / ulp) <= 2.0


def test_vexp_special_values_match_math_exp_and_subnormals_flush_to_zero():
    special = np.array([np.nan, np.inf, -np.inf, 709.79, 1000.0, -708.31, -745.2, -1e300])
    got = _vexp(special)
    assert math.isnan(got[0])
    assert got[1] == np.inf and got[2] == 0.0 and got[3] == np.inf and got[4] == np.inf
    np.testing.assert_array_equal(got[5:], 0.0)


def _mode_source(mode: str, dtype: str = "float32") -> str:
    """The generated CPU source of a lone scalar-map@2 node of ``mode``."""
    from atoms.elementwise import SPECS, single_step
    from runtime.backends import cpu_codegen
    from runtime.core.types import TensorType
    from runtime.plugins.atomspec import Node
    from runtime.plugins.kernel import KernelRequest

    spec = [s for s in SPECS if s.name == "scalar-map"][-1]
    t = TensorType(("n",), (8,), dtype, "anonymous")
    node = Node(0, "x", spec, {"mode": mode}, ("in0",), "%o", (t,), t, "$")
    kernel = cpu_codegen.elementwise_kernel(KernelRequest(None, single_step(node)))
    return kernel.warm.__self__._make_source(False)  # (Kernel.warm is its NestKernel's)


def test_scalar_map_kernels_evaluate_the_cpu_form_the_atom_declares():
    from atoms.elementwise import SCALAR_CPU_V2

    src = _mode_source("silu")
    assert vmath.IMPORT in src and "_vexp(-abs(_e0))" in src and "math.exp" not in src
    assert "_vgelu(_e0)" in _mode_source("gelu") and "math.erf" not in _mode_source("gelu")
    assert "_vtanh(_e0)" in _mode_source("tanh", "float64")
    assert set(SCALAR_CPU_V2) == {"gelu", "sigmoid", "silu", "tanh", "exp", "log", "log1p", "softplus"}
    assert "math.sin(_e0)" in _mode_source("sin")  # no CPU form: the expression itself


def test_cpu_forms_may_call_only_the_helpers_vmath_binds():
    from runtime.plugins.expressions import CPU_HELPERS, ExpressionError, check_text

    assert CPU_HELPERS == vmath.CPU_HELPERS
    namespace = {}
    exec(vmath.IMPORT.split("#")[0] + "\n" + vmath.LOG_IMPORT.split("#")[0], namespace)
    assert set(CPU_HELPERS) <= set(namespace)
    assert check_text("_vtanh({0})", 1, CPU_HELPERS) == "_vtanh(_x0)"
    with pytest.raises(ExpressionError):
        check_text("_vtanh({0})", 1)  # not in the portable expression


def test_float32_arguments_evaluate_in_float32_within_two_ulp():
    rng = np.random.default_rng(1)
    x = np.concatenate([np.linspace(-87.33, 88.72, 400_001), rng.standard_normal(200_000) * 4,
                        rng.uniform(-1e-4, 1e-4, 1000), [0.0, -0.0, 1.0, -1.0, 88.72283]]).astype(np.float32)
    got = _vexp(x)
    assert got.dtype == np.float32
    assert _exp_all.nopython_signatures[-1].args[0].dtype.bitwidth == 32
    want = np.exp(x.astype(np.float64))
    ulp = np.spacing(want.astype(np.float32)).astype(np.float64)
    assert np.max(np.abs(got - want) / ulp) <= 2.0
    # float32 evaluation, not float64 rounded: some results differ from the float64 path's
    assert np.any(got != _vexp(x.astype(np.float64)).astype(np.float32))


def test_float32_special_values_and_flush_below_the_smallest_normal():
    special = np.array([np.nan, np.inf, -np.inf, 88.73, 1000.0, -87.34, -103.0, -3e38], np.float32)
    got = _vexp(special)
    assert math.isnan(got[0])
    assert got[1] == np.inf and got[2] == 0.0 and got[3] == np.inf and got[4] == np.inf
    np.testing.assert_array_equal(got[5:], 0.0)


def test_vexp_is_math_exp_in_plain_python():
    assert vexp(1.5) == math.exp(1.5)


# --- erf and tanh over the whole float32 / float64 range -------------------------------------

_erf_all = _over_all(verf)


_tanh_all = _over_all(vtanh)


def _apply(kernel, x):
    out = np.empty_like(x)
    kernel(x, out)
    return out


def _sweep64(per_binade: int = 300, seed: int = 0) -> np.ndarray:
    """Every float64 binade (subnormals included) with random mantissas, both signs, and the
    special values."""
    rng = np.random.default_rng(seed)
    exponents = np.repeat(np.arange(0, 2047, dtype=np.uint64), per_binade)
    mantissas = rng.integers(0, 1 << 52, exponents.size, dtype=np.uint64)
    x = ((exponents << np.uint64(52)) | mantissas).view(np.float64)
    special = [0.0, -0.0, np.inf, -np.inf, np.nan, 5e-324, -5e-324, 2.2250738585072014e-308,
               1.7976931348623157e308, -1.7976931348623157e308, 1.0, -1.0, 0.625, 2.0, 3.5, 6.0]
    return np.concatenate([x, -x, np.linspace(-7, 7, 200_001), special])


def _sweep32(stride: int = 4093) -> np.ndarray:
    """Every stride-th float32 bit pattern (all binades, subnormals, both signs, inf, NaNs)."""
    bits = np.arange(0, 1 << 32, stride, dtype=np.uint64).astype(np.uint32)
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, -1e-45, 3.4028235e38, 1.0, -1.0],
                       np.float32)
    return np.concatenate([bits.view(np.float32), special, np.linspace(-7, 7, 100_001, dtype=np.float32)])


def _ulp_error(got: np.ndarray, want: np.ndarray) -> float:
    """Max |got - want| in units of the float type's spacing at want; NaN must meet NaN and
    infinities must be equal."""
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got), nan)
    inf = np.isinf(want)
    assert np.array_equal(got[inf], want[inf])
    ok = ~nan & ~inf
    with np.errstate(over="ignore"):  # the largest finite values' spacing is inf: error 0
        spacing = np.spacing(want[ok].astype(got.dtype)).astype(np.float64)
    return float(np.max(np.abs(got[ok].astype(np.float64) - want[ok].astype(np.float64)) / np.abs(spacing)))


ERF_ULP64, TANH_ULP64, ULP32 = 2.0, 2.0, 1.0  # the stated bounds (module docstring)


def test_verf_float64_is_within_two_ulp_of_libm_over_every_binade():
    x = _sweep64()
    want = np.frompyfunc(math.erf, 1, 1)(x).astype(np.float64)
    got = _apply(_erf_all, x)
    assert _ulp_error(got, want) <= ERF_ULP64
    assert np.signbit(got[x == 0]).tolist() == np.signbit(x[x == 0]).tolist()  # erf(-0) = -0


def test_vtanh_float64_is_within_two_ulp_of_libm_over_every_binade():
    x = _sweep64(seed=1)
    want = np.tanh(x)
    got = _apply(_tanh_all, x)
    assert _ulp_error(got, want) <= TANH_ULP64
    assert np.signbit(got[x == 0]).tolist() == np.signbit(x[x == 0]).tolist()


def test_verf_and_vtanh_float32_are_within_one_ulp_over_sampled_bit_patterns():
    x = _sweep32()
    with np.errstate(invalid="ignore"):  # signalling NaN patterns
        wide = x.astype(np.float64)
    for kernel, ref in ((_erf_all, np.frompyfunc(math.erf, 1, 1)), (_tanh_all, np.tanh)):
        got = _apply(kernel, x)
        assert got.dtype == np.float32
        assert _ulp_error(got, ref(wide).astype(np.float64)) <= ULP32, kernel


def test_verf_and_vtanh_are_libm_in_plain_python():
    assert verf(0.3) == math.erf(0.3) and vtanh(0.3) == math.tanh(0.3)


def test_verf_and_vtanh_loops_vectorise():
    """Inlined into the caller (``overload(inline="always")``), so LLVM vectorises the loop:
    a call per element would keep it scalar."""
    import re

    @njit(error_model="numpy")
    def gelu(x, out):
        for i in range(x.size):
            out[i] = 0.5 * x[i] * (1.0 + verf(x[i] * 0.7071067811865476)) + vtanh(x[i])

    x = np.linspace(-3, 3, 64)
    out = np.empty_like(x)
    gelu(x, out)
    ir = gelu.inspect_llvm(gelu.signatures[0])
    assert len(re.findall(r"<\d+ x double>", ir)) > 50
    assert not re.search(r"call [^\n]*(@erf\(|@tanh\(|_erf64|_tanh64|_verf_typed|_vtanh_typed)", ir)


def test_modules_inline_erf_and_tanh_only_up_to_max_inlined_calls():
    few = [vmath.IMPORT] + [f"    v{i} = _verf(x) + _vexp(x)" for i in range(vmath.MAX_INLINED - 1)] + ["    w = _vtanh(x)"]
    assert vmath.with_imports(few) == few
    many = few + ["    z = _vgelu(x)"]
    got = vmath.with_imports(many)
    assert vmath.IMPORT not in got and got[:2] == list(vmath.LIBM_IMPORT) and got[2:] == many[1:]
    namespace = {}
    exec("\n".join(vmath.LIBM_IMPORT), namespace)  # the same names, libm's (exp: always vexp)
    assert namespace["_verf"] is math.erf and namespace["_vtanh"] is math.tanh and namespace["_vexp"] is vexp
    assert namespace["_vgelu"](0.3) == 0.5 * 0.3 * (1.0 + math.erf(0.3 * 0.7071067811865476))


# --- the float32 gelu ------------------------------------------------------------------------

_gelu_all = _over_all(vmath.vgelu)


def _gelu_exact(x: np.ndarray) -> np.ndarray:
    """x·Φ(x) in float64 through erfc, which never cancels (the formula's 1 + erf does for x < 0)."""
    from scipy.special import erfc

    with np.errstate(all="ignore"):
        w = x.astype(np.float64)
        return 0.5 * w * erfc(-w / math.sqrt(2.0))


GELU_ULP32, GELU_ULP32_CORE = 4.5, 1.5  # the stated bounds: everywhere, and for |x| < 1


def test_vgelu_float32_is_within_its_stated_ulp_bounds_over_the_whole_range():
    tail = np.arange(np.float32(-1.0).view(np.int32), np.float32(-15.5).view(np.int32), 7,
                     dtype=np.int32).view(np.float32)  # every 7th float32 of the negative tail
    x = np.concatenate([_sweep32(stride=1021), np.linspace(-15, 6, 400_001, dtype=np.float32),
                        np.float32(-np.logspace(-45, 1.2, 20_000)), tail])
    got = _apply(_gelu_all, x)
    assert got.dtype == np.float32 and _gelu_all.nopython_signatures[-1].args[0].dtype.bitwidth == 32
    want = _gelu_exact(x)
    finite = np.isfinite(x)
    assert _ulp_error(got[finite], want[finite]) <= GELU_ULP32
    core = finite & (np.abs(x) < 1)
    assert _ulp_error(got[core], want[core]) <= GELU_ULP32_CORE
    # the negative tail keeps its value down to subnormal results, where 1 + erf(t) is 0
    tail = finite & (x < -7) & (want < -1e-44)
    assert tail.sum() > 1000 and np.all(got[tail] < 0)


def test_vgelu_float32_special_values_are_the_formulas():
    x = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, -1e-45, 3.4028235e38, -3.4028235e38, -1e4],
                 np.float32)
    got = _apply(_gelu_all, x)
    with np.errstate(all="ignore"):
        formula = np.array([vmath.vgelu(float(v)) if np.isfinite(v) else 0.5 * float(v) * (1.0 + math.erf(float(v)))
                            for v in x]).astype(np.float32)
    np.testing.assert_array_equal(got, formula)  # -inf: NaN (-inf · 0), as the formula
    assert np.signbit(got).tolist() == np.signbit(formula).tolist()


@pytest.mark.slow  # (CI runs the slow set after the suite: README)
def test_vgelu_float64_is_the_formula_with_verf_bit_for_bit():
    @njit(error_model="numpy")
    def formula(x, out):
        for i in range(x.size):
            out[i] = 0.5 * x[i] * (1.0 + verf(x[i] * 0.7071067811865476))

    x = _sweep64(per_binade=20, seed=3)
    np.testing.assert_array_equal(_apply(_gelu_all, x), _apply(formula, x))
    assert vmath.vgelu(0.3) == 0.5 * 0.3 * (1.0 + math.erf(0.3 * 0.7071067811865476))


def test_the_gelu_atom_declares_vgelu_as_its_cpu_form():
    from atoms.elementwise import SCALAR_CPU, SCALAR_EXPRS

    assert SCALAR_EXPRS["gelu"] == vmath.GELU_EXPR and SCALAR_CPU["gelu"] == "_vgelu({0})"


def _float32_loop(kernel, x: np.ndarray) -> tuple[int, list[str]]:
    """(vector operations on floats, functions called) in ``kernel``'s float32 compilation."""
    import re

    _apply(kernel, x)
    ir = kernel.inspect_llvm(next(sig for sig in kernel.signatures if str(sig[0].dtype) == "float32"))
    return len(re.findall(r"<\d+ x float>", ir)), re.findall(r"call [^@\n]*@([\w.$\"]+)\(", ir)


def test_vgelu_float32_loop_vectorises():
    import re

    vectors, called = _float32_loop(_gelu_all, np.linspace(-3, 3, 64, dtype=np.float32))
    assert vectors > 50
    assert not [name for name in called if re.search("gelu32|vgelu|exp32|erf", name)]  # inlined whole


def test_softplus_kernels_use_the_vector_log1p_and_import_it():
    from atoms.elementwise import SCALAR_CPU_V2
    from runtime.backends.cpu_codegen import render

    body = ["    for i in range(out.shape[0]):", f"        out[i] = {SCALAR_CPU_V2['softplus'].format('x0[i]')}"]
    src = render("t", [("x0", "float32", 1, False), ("out", "float32", 1, True)], body, False)
    assert "_vlog1p(_vexp(x0[i]))" in src and "math.log1p" not in src and vmath.LOG_IMPORT in src
    plain = render("t", [("x0", "float32", 1, False), ("out", "float32", 1, True)],
                   ["    for i in range(out.shape[0]):", "        out[i] = _vexp(x0[i])"], False)
    assert vmath.LOG_IMPORT not in plain  # sources without log keep their text (and cached kernels)


_gelu_grad_all = _over_all(vmath.vgelu_grad)
GELU_GRAD_ULP32 = 5  # of the larger of Φ(x) and |x|·φ(x): their sum cancels at gelu′'s root


def test_vgelu_grad_float32_is_in_float32_and_within_its_stated_bound():
    """Φ by erfc in float32 (1 + erf lost the negative tail), x² split exactly for φ: the
    gelu's backward epilogue ran on float64 erf (3x slower) when the literals promoted it."""
    from scipy.special import erfc

    x = np.concatenate([np.linspace(-13, 13, 400_001, dtype=np.float32), np.float32(-np.logspace(-30, 1.1, 5000))])
    got = _apply(_gelu_grad_all, x)
    assert got.dtype == np.float32 and _gelu_grad_all.nopython_signatures[-1].args[0].dtype.bitwidth == 32
    w = x.astype(np.float64)
    cdf, tail = 0.5 * erfc(-w / math.sqrt(2.0)), w * 0.3989422804014327 * np.exp(-0.5 * w * w)
    scale = np.maximum(np.abs(cdf), np.abs(tail)).astype(np.float32)
    normal = scale >= np.finfo(np.float32).tiny
    err = np.abs(got - (cdf + tail))[normal] / np.spacing(scale[normal]).astype(np.float64)
    assert err.max() <= GELU_GRAD_ULP32
    assert np.all(got[(x < -9) & normal] < 0)  # the negative tail, not 0 from 1 + erf(t)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_vgelu_grad_special_values(dtype):
    x = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 40.0, -40.0, 1e30, -1e30], dtype)
    got = _apply(_gelu_grad_all, x)
    np.testing.assert_array_equal(got, np.array([0.5, 0.5, 1.0, 0.0, np.nan, 1.0, 0.0, 1.0, 0.0], dtype))
    assert vmath.vgelu_grad(0.3) == 0.5 * (1.0 + math.erf(0.3 * 0.7071067811865476)) + \
        0.3 * 0.3989422804014327 * math.exp(-0.5 * 0.3 * 0.3)


def test_the_gelu_vjp_declares_vgelu_grad_as_its_cpu_form_and_vectorises():
    import re

    from atoms.scalar_map_vjp import VJP_CPU

    assert VJP_CPU["gelu"] == "({1} * _vgelu_grad({0}))"
    vectors, called = _float32_loop(_gelu_grad_all, np.linspace(-3, 3, 64, dtype=np.float32))
    assert vectors > 50
    assert not [name for name in called if re.search("gelu|phi|exp32|erf", name)]  # inlined whole
