"""contract: infer rules and error paths, the einsum reference against hand-computed values,
the cpu kernel and anchor (BLAS tiles + fused epilogue) and the cuda kernel (simulator)
against the reference."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from atoms.contract import SPECS, lowering, render, tiles
from runtime.plugins.atomspec import ScalarOp, bind_node
from runtime.plugins.kernel import request_for
from runtime.core.errors import FormulaError
from runtime.plan.fusion import CHAIN, EMPTY_EPILOGUE, Epilogue, EpilogueStep
from runtime.kernels.layout import align_to
from runtime.testing import real_cuda
from runtime.core.types import TensorType

CONTRACT = SPECS[0]
P = "$.instructions[0]"


def T(axes, sizes, dtype="float32", domain="d"):
    return TensorType(tuple(axes), tuple(sizes), dtype, domain)


def attrs(pairs, out, acc="float32"):
    return {"reduce_axes": [list(p) for p in pairs], "output_axes": list(out), "accumulation_dtype": acc}


def bind(pairs, out, lt, rt, acc="float32"):
    return bind_node(CONTRACT, attrs(pairs, out, acc), [lt, rt])


def reference(node, *inputs):
    out = np.empty(node.output_type.shape, inputs[0].dtype)
    CONTRACT.kernels["reference"](request_for(node))(list(inputs), (), out)
    return out


def error(attributes, lt, rt):
    with pytest.raises(FormulaError) as info:
        bind_node(CONTRACT, attributes, [lt, rt])
    return info.value


# --- infer -------------------------------------------------------------------------------

L, R = T("ik", (2, 3)), T("kj", (3, 4))


def test_infer_matmul_and_symbolic_sizes():
    assert bind([("k", "k")], "ij", L, R).output_type == T("ij", (2, 4))
    node = bind([("D", "D")], "BSR", T("BSD", ("B", "S", 1024)), T("RD", (32, "D")))
    assert node.output_type.sizes == ("B", "S", 32)
    assert bind([("k", "k")], "ji", L, R).output_type == T("ji", (4, 2))


@pytest.mark.parametrize("attributes, path, words", [
    (attrs([], "ij"), ".reduce_axes", "non-empty"),
    ({**attrs([], "ij"), "reduce_axes": "k"}, ".reduce_axes", "string 'k'"),
    ({**attrs([], "ij"), "reduce_axes": [["k"]]}, ".reduce_axes[0]", "pair"),
    ({**attrs([], "ij"), "reduce_axes": [["k", 3]]}, ".reduce_axes[0][1]", "axis name"),
    (attrs([("x", "k")], "ij"), ".reduce_axes[0][0]", "left has no axis 'x'"),
    (attrs([("k", "j")], "ij"), ".reduce_axes[0][0]", "alias"),
    (attrs([("k", "k"), ("k", "j")], "i"), ".reduce_axes[1][0]", "already reduced by reduce_axes[0]"),
    (attrs([("i", "j"), ("k", "j")], ""), ".reduce_axes[1][1]", "already reduced"),
    (attrs([("k", "k")], "ik"), ".output_axes", "permutation"),
    (attrs([("k", "k")], "iij"), ".output_axes", "repeat"),
    ({**attrs([("k", "k")], "ij"), "output_axes": "ij"}, ".output_axes", "list"),
    (attrs([("k", "k")], "ij", "float16"), ".accumulation_dtype", "'float16'"),
])
def test_attribute_errors(attributes, path, words):
    e = error(attributes, L, R)
    assert (e.code, e.path) == ("atom_attributes", P + ".attributes" + path)
    assert words in e.message


def test_aliasing_pair_rejected_on_both_sides():
    # left i against right k, but left keeps k: output would hold two axes named k
    e = error(attrs([("i", "k")], "kj"), L, R)
    assert e.path == P + ".attributes.reduce_axes[0][1]" and "alias" in e.message
    # left k against right x while right keeps an axis k
    e = error(attrs([("k", "x")], "ikj"), L, T("xk", (3, 5)))
    assert e.path == P + ".attributes.reduce_axes[0][0]"
    # crossed pairs reduce both names on both sides: fine
    node = bind([("i", "k"), ("k", "i")], "", T("ik", (2, 3)), T("ki", (2, 3)))
    assert node.output_type.axes == ()


@pytest.mark.parametrize("lt, rt, words", [
    (T("ik", (2, 3)), T("kj", (5, 4)), "reduced pair"),
    (T("bik", (2, 2, 3)), T("bkj", (3, 3, 4)), "batch axis 'b'"),
    (T("ik", (2, 3)), T("kj", (3, 4), "float64"), "float64"),
    (T("ik", (2, 3)), T("kj", (3, 4), domain="other"), "domain"),
    (T("ik", (2, 3), "boolean"), T("kj", (3, 4), "boolean"), "numeric"),
])
def test_type_mismatch(lt, rt, words):
    out = [a for a in lt.axes if a != "k"] + [a for a in rt.axes if a != "k" and a not in lt.axes]
    e = error(attrs([("k", "k")], out), lt, rt)
    assert e.code == "type_mismatch" and e.path.startswith(P + ".input_slots[")
    assert words in e.message


def test_symbolic_extents_checked_only_when_static():
    bind([("k", "k")], "ij", T("ik", (2, "K")), T("kj", (3, 4)))  # may match at run time
    bind([("k", "k")], "ij", T("ik", (2, "K")), T("kj", ("M", 4)))
    with pytest.raises(FormulaError) as info:
        bind([("k", "k")], "ij", T("ik", (2, 3)), T("kj", (4, 4)))
    assert info.value.code == "type_mismatch"


# --- reference vs hand-computed -------------------------------------------------------------

def test_reference_matmul_by_hand():
    a = np.array([[1, 2, 3], [4, 5, 6]], np.float32)
    b = np.array([[1, 0], [0, 1], [1, 1]], np.float32)
    node = bind([("k", "k")], "ij", T("ik", (2, 3)), T("kj", (3, 2)))
    np.testing.assert_array_equal(reference(node, a, b), [[4, 5], [10, 11]])
    node = bind([("k", "k")], "ji", T("ik", (2, 3)), T("kj", (3, 2)))
    np.testing.assert_array_equal(reference(node, a, b), [[4, 10], [5, 11]])


def test_reference_batch_axis_and_differently_named_pairs():
    a = np.array([[[1, 2]], [[3, 4]]], np.float64)  # b=2, i=1, k=2
    b = np.array([[10, 20], [30, 40]], np.float64)  # r (reduced with k) = 2, b = 2
    node = bind([("k", "r")], "bi", T("bik", (2, 1, 2), "float64"), T("rb", (2, 2), "float64"))
    # out[b, i] = sum_k a[b, i, k] * b[k, b]
    expected = [[1 * 10 + 2 * 30], [3 * 20 + 4 * 40]]
    got = reference(node, a, b)
    assert got.dtype == np.float64 and node.output_type.axes == ("b", "i")
    np.testing.assert_array_equal(got, expected)


def test_reference_two_reduced_pairs_and_full_contraction():
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = np.arange(6, dtype=np.float32).reshape(3, 2)
    node = bind([("p", "q"), ("s", "t")], "", T("ps", (2, 3)), T("tq", (3, 2)))
    assert node.output_type.shape == ()
    assert reference(node, a, b) == sum(a[p, s] * b[s, p] for p in range(2) for s in range(3))
    node = bind([("s", "s")], "pq", T("ps", (2, 3)), T("sq", (3, 2)))  # an outer-free matmul
    np.testing.assert_array_equal(reference(node, a, b), a @ b)


def test_reference_size_one_axes_and_outer_product():
    a = np.array([[2.0]], np.float32)
    b = np.array([[3.0, 4.0]], np.float32)
    node = bind([("k", "k")], "ji", T("ik", (1, 1)), T("kj", (1, 2)))
    np.testing.assert_array_equal(reference(node, a, b), [[6.0], [8.0]])


def test_reference_accumulates_in_float32_for_float16():
    a = np.full((1, 4096), 1.0, np.float16)
    b = np.full((4096, 1), 1.0, np.float16)
    node = bind([("k", "k")], "ij", T("ik", (1, 4096), "float16"), T("kj", (4096, 1), "float16"))
    got = reference(node, a, b)
    assert got.dtype == np.float16 and got[0, 0] == 4096  # float16 alone would stall at 2048


# --- cpu / cuda vs reference ------------------------------------------------------------

def random_array(rng, t: TensorType):
    return rng.standard_normal(t.shape).astype(t.dtype)


def strided_copy(rng, x):
    """The same values held in a non-contiguous, read-only view (Fortran or reversed)."""
    if x.ndim >= 2 and rng.random() < 0.5:
        y = np.asfortranarray(x)
    else:
        big = np.empty(x.shape[:-1] + (2 * x.shape[-1],), x.dtype) if x.ndim else np.empty((), x.dtype)
        if x.ndim:
            big[..., ::2] = x
            y = big[..., ::2]
        else:
            big[...] = x
            y = big
    y.flags.writeable = False
    return y


@st.composite
def layouts(draw):
    """A contraction with every role possibly present: batch, M, N and reduced axes, random
    axis orders, differently named reduced pairs."""
    ext = st.integers(1, 5)
    nbatch, nm, nn, nk = (draw(st.integers(lo, 2)) for lo in (0, 0, 0, 1))
    batch = [(f"b{i}", draw(ext)) for i in range(nbatch)]
    m = [(f"m{i}", draw(ext)) for i in range(nm)]
    n = [(f"n{i}", draw(ext)) for i in range(nn)]
    k = [(f"k{i}", draw(ext)) for i in range(nk)]
    renamed = [draw(st.booleans()) for _ in k]
    left = draw(st.permutations(batch + m + k))
    right = draw(st.permutations(batch + [(f"r{i}" if rn else a, e) for i, ((a, e), rn) in
                                          enumerate(zip(k, renamed))] + n))
    pairs = [(a, f"r{i}" if rn else a) for i, ((a, _), rn) in enumerate(zip(k, renamed))]
    natural = [a for a, _ in left if not a.startswith("k")] + [a for a, _ in n]
    out = draw(st.permutations(natural))
    lt = T([a for a, _ in left], [e for _, e in left])
    rt = T([a for a, _ in right], [e for _, e in right])
    return pairs, out, lt, rt


def close(got, want, k, dtype=np.float32):
    tol = (1e-5 if dtype == np.float32 else 1e-12) * max(1, k) * 4
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


@pytest.mark.slow  # (CI runs the slow set after the suite: README)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layout=layouts(), seed=st.integers(0, 2**16))
def test_cpu_matches_reference(layout, seed):
    pairs, out, lt, rt = layout
    node = bind(pairs, out, lt, rt)
    rng = np.random.default_rng(seed)
    a, b = random_array(rng, lt), random_array(rng, rt)
    want = reference(node, a, b)
    a2, b2 = strided_copy(rng, a), strided_copy(rng, b)
    got = np.full(node.output_type.shape, np.nan, np.float32)
    CONTRACT.kernels["cpu"](request_for(node))([a2, b2], (), got)
    close(got, want, lowering.lower(lt, rt, pairs).dims[3])
    np.testing.assert_array_equal(a2, a)


def epilogue_for(node, factor_type):
    """v -> v * factor (broadcast) -> base + v: the seed's second group."""
    steps = (EpilogueStep(node, ScalarOp("({0} * {1})"), (CHAIN, 0)),
             EpilogueStep(node, ScalarOp("({0} + {1})"), (1, CHAIN)))
    return Epilogue(steps, ("factor", "base"), (factor_type, node.output_type))


@pytest.mark.slow  # (CI runs the slow set after the suite: README)
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layout=layouts(), seed=st.integers(0, 2**16), data=st.data())
def test_cpu_anchor_with_epilogue_matches_reference(layout, seed, data):
    pairs, out, lt, rt = layout
    node = bind(pairs, out, lt, rt)
    ot = node.output_type
    kept = [a for a in ot.axes if data.draw(st.booleans())]  # factor over a subset of axes
    ft = T(kept, [ot.size_of(a) for a in kept])
    rng = np.random.default_rng(seed)
    a, b = random_array(rng, lt), random_array(rng, rt)
    factor, base = random_array(rng, ft), random_array(rng, ot)
    want = base + reference(node, a, b) * align_to(factor, ft, ot)
    run = CONTRACT.kernels["cpu"](request_for(node, epilogue_for(node, ft)))
    got = np.full(ot.shape, np.nan, np.float32)
    run([a, b], [align_to(factor, ft, ot), align_to(base, ot, ot)], got)
    close(got, want, lowering.lower(lt, rt, pairs).dims[3])


@pytest.mark.parametrize("rows", [3, 300])  # one tile on BLAS, and blocked tiles in parallel
def test_cpu_anchor_reads_an_epilogue_operand_in_its_output_memory_through_the_output(rows):
    """``output_extras``: the output is the base operand's buffer (in-place reuse); the kernel
    reads base where it writes, never through its own array (which would keep LLVM's loop
    scalar), and still computes base + v · factor."""
    node = bind([("D", "D")], "TF", T("TD", (rows, 256)), T("FD", (512, 256)))
    ot = node.output_type
    ft = T("F", (512,))
    rng = np.random.default_rng(5)
    a, b = random_array(rng, node.input_types[0]), random_array(rng, node.input_types[1])
    factor, base = random_array(rng, ft), random_array(rng, ot)
    want = base + reference(node, a, b) * align_to(factor, ft, ot)
    run = CONTRACT.kernels["cpu"](request_for(node, epilogue_for(node, ft), output_extras=(1,)))
    got = base.copy()  # base's buffer is the output
    poisoned = np.full(ot.shape, np.nan, np.float32)  # what the kernel would read were it base's own array
    run([a, b], [align_to(factor, ft, ot), poisoned], got)
    close(got, want, 256)


def test_cpu_seed_group_parallel_path_and_blas_threads_restored():
    from threadpoolctl import threadpool_info

    def scipy_threads():
        return [p["num_threads"] for p in threadpool_info() if "scipy.libs" in p["filepath"]]
    node = bind([("D", "D")], "BSR", T(("B", "S", "D"), (2, 256, 64)), T("RD", (96, 64)))
    assert 2 * 256 * 96 * 64 >= tiles.PARALLEL_MIN_MACS
    silu = Epilogue((EpilogueStep(node, ScalarOp("({0} / (1.0 + math.exp(-{0})))"), (CHAIN,)),), (), ())
    rng = np.random.default_rng(1)
    x, w = rng.standard_normal((2, 256, 64)).astype(np.float32), rng.standard_normal((96, 64)).astype(np.float32)
    got = np.empty((2, 256, 96), np.float32)
    run = CONTRACT.kernels["cpu"](request_for(node, silu))
    before = scipy_threads()  # (once building the kernel has loaded scipy's BLAS)
    run([x, w], [], got)
    v = reference(node, x, w)
    close(got, v / (1 + np.exp(-v)), 64)
    assert scipy_threads() == before


@pytest.mark.parametrize("left, right, out, guarded", [
    (T("ik", (256, 32)), T("jk", (1024, 32)), "ij", False),
    (T("bik", (2, 70, 32)), T("bjk", (2, 1024, 32)), "bij", True)])
def test_blas_guard_only_where_a_micro_kernel_call_can_reach_blas(left, right, out, guarded):
    """A parallel micro-kernel call whose tiles all have more than GEMV_ROWS rows calls no
    BLAS, so it runs without the single-threaded-BLAS guard (two ctypes calls per run); a
    tile of a few rows (70 rows a batch: tiles of 66 and 4) calls gemv inside the parallel
    loop, so its call keeps the guard."""
    node = bind([("k", "k")], out, left, right)
    run = CONTRACT.kernels["cpu"](request_for(node, EMPTY_EPILOGUE))
    assert run.compiled is not None and (run.compiled.guard is not None) == guarded
    rng = np.random.default_rng(4)
    a, b = random_array(rng, left), random_array(rng, right)
    got = np.empty(node.output_type.shape, np.float32)
    run([a, b], [], got)
    close(got, reference(node, a, b), 32)


def test_cpu_float64_and_unsupported_dtypes():
    node = bind([("k", "k")], "ji", T("ik", (3, 4), "float64"), T("kj", (4, 2), "float64"), "activation")
    rng = np.random.default_rng(2)
    a, b = rng.standard_normal((3, 4)), rng.standard_normal((4, 2))
    got = np.empty((2, 3))
    CONTRACT.kernels["cpu"](request_for(node))([a, b], (), got)
    close(got, (a @ b).T, 4, np.float64)
    half = bind([("k", "k")], "ij", T("ik", (3, 4), "float16"), T("kj", (4, 2), "float16"))
    for backend in ("cpu", "cuda"):
        with pytest.raises(FormulaError) as info:
            CONTRACT.kernels[backend](request_for(half))
        assert info.value.code == "backend_unavailable" and "float16" in info.value.message


def test_cpu_small_call_and_full_contraction():
    node = bind([("k", "k")], "", T("k", (7,)), T("k", (7,)))
    a, b = np.arange(7, dtype=np.float32), np.ones(7, np.float32)
    got = np.empty((), np.float32)
    CONTRACT.kernels["cpu"](request_for(node))([a, b], (), got)
    assert got == 21


CUDA_CASES = [  # (pairs, out, left, right, epilogue?) — grids of at most a few hundred threads
    ([("D", "D")], "BSR", T(("B", "S", "D"), (1, 5, 20)), T("RD", (3, 20)), True),
    ([("k", "r")], "jbi", T("bik", (2, 3, 4)), T("jrb", (5, 4, 2)), True),
    ([("k", "k")], "ij", T("ik", (4, 17), "float64"), T("kj", (17, 3), "float64"), False),
]
if real_cuda():  # several blocks and partial tiles in every direction, batches past one block
    CUDA_CASES += [
        ([("D", "D")], "BSR", T(("B", "S", "D"), (2, 300, 1030)), T("RD", (33, 1030)), True),
        ([("R", "R")], "BSD", T(("B", "S", "R"), (2, 300, 33)), T("DR", (1030, 33)), True),
        ([("k", "r")], "jbi", T("bik", (70, 37, 45)), T("jrb", (19, 45, 70)), True),
        ([("k", "k")], "ij", T("ik", (129, 257), "float64"), T("kj", (257, 65), "float64"), False),
    ]


@pytest.mark.parametrize("pairs, out, lt, rt, fused", CUDA_CASES)
def test_cuda_matches_reference(pairs, out, lt, rt, fused):
    from numba import cuda

    node = bind(pairs, out, lt, rt)
    ot = node.output_type
    dt = np.dtype(lt.dtype)
    rng = np.random.default_rng(3)
    a, b = random_array(rng, lt), random_array(rng, rt)
    want = reference(node, a, b)
    dout = cuda.device_array(ot.shape, dt)
    if fused:
        ft = T(ot.axes[-1:], ot.sizes[-1:])
        factor, base = random_array(rng, ft), random_array(rng, ot)
        want = base + want * align_to(factor, ft, ot)
        keep = factor.reshape([1] * (ot.rank - 1) + [ot.sizes[-1]])
        run = CONTRACT.kernels["cuda"](request_for(node, epilogue_for(node, ft)))
        run([cuda.to_device(a), cuda.to_device(b)], [cuda.to_device(keep), cuda.to_device(base)], dout)
    else:
        CONTRACT.kernels["cuda"](request_for(node))([cuda.to_device(a), cuda.to_device(b)], (), dout)
    close(dout.copy_to_host(), want, lowering.lower(lt, rt, pairs).dims[3], dt.type)


def test_empty_epilogue_anchor_equals_plain_kernel():
    node = bind([("k", "k")], "ij", L, R)
    rng = np.random.default_rng(4)
    a, b = random_array(rng, L), random_array(rng, R)
    x, y = np.empty((2, 4), np.float32), np.empty((2, 4), np.float32)
    CONTRACT.kernels["cpu"](request_for(node, EMPTY_EPILOGUE))([a, b], [], x)
    CONTRACT.kernels["cpu"](request_for(node))([a, b], (), y)
    np.testing.assert_array_equal(x, y)


# --- register-blocked micro-kernel tiles (atoms.contract.micro) ----------------------------------

def micro_form(*dims):
    from atoms.contract import micro

    return micro.choose_form(*dims)


def force_form(monkeypatch, form):
    """Every contract kernel built now uses ``form`` where its operands allow; returns the list
    of (form, usable) answers the runs gave, so a test can see the micro-kernel ran."""
    from atoms.contract import micro

    seen = []
    usable = micro.usable
    monkeypatch.setattr(micro, "choose_form", lambda *dims: form)
    def usable_seen(f, ta, tb):  # (the answers for the forced form: the kernel also asks about dot)
        got = usable(f, ta, tb)
        if f == form:
            seen.append(got)
        return got

    monkeypatch.setattr(micro, "usable", usable_seen)
    return seen


@pytest.mark.parametrize("mr,nv,lanes", [(6, 2, 8), (6, 2, 16), (4, 4, 16), (4, 4, 8)])
def test_blocked_tile_generator_at_each_register_shape(mr, nv, lanes):
    """The blocked tile at either host's shape (4 x 4 with AVX-512, 6 x 2 without) and vector
    width, whichever this host picks: rows off whole strips, columns off panels, K over a slice."""
    from bench.lab.blocked_tile_ab import make, pack

    gemm, nr = make(mr, nv, lanes, 256)
    rng = np.random.default_rng(mr * 100 + nv * 10 + lanes)
    m, k, n = 37, 300, 70
    a, b = rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32)
    out = np.empty(m * n, np.float32)
    gemm(a.reshape(-1), pack(b, nr), out, m, n, k, 16)
    np.testing.assert_allclose(out.reshape(m, n), a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)


MICRO_CASES = [  # rows and columns with block remainders (rows: every halving block), K
    # below, at and above a vector
    ("dot", [("k", "k")], "ij", T("ik", (37, 300)), T("jk", (19, 300))),
    ("dot", [("k", "k")], "ij", T("ik", (7, 40)), T("jk", (3, 40))),
    ("bcast", [("k", "k")], "ij", T("ik", (9, 20)), T("jk", (33, 20))),
    ("bcast", [("k", "k")], "ij", T("ik", (14, 7)), T("jk", (16, 7))),
    ("bcast", [("k", "k")], "ij", T("ik", (13, 300)), T("jk", (20, 300))),  # long K, either layout
    ("bcast", [("k", "k")], "ij", T("ki", (300, 13)), T("jk", (20, 300))),
    ("dot", [("k", "k")], "bij", T("bik", (2, 9, 13)), T("jk", (5, 13))),
    ("dot", [("k", "k")], "bji", T("bik", (2, 6, 8)), T("bjk", (2, 3, 8))),
    ("bcast", [("k", "k")], "ij", T("ik", (37, 24)), T("jk", (40, 24))),
    ("bcast", [("k", "k")], "ij", T("ki", (7, 13)), T("kj", (7, 35))),
    ("bcast", [("k", "k")], "bij", T("bik", (2, 11, 5)), T("bkj", (2, 5, 17))),
    # blocked: rows and columns off whole strips and panels, K over one slice and not whole
    ("blocked", [("k", "k")], "ij", T("ik", (13, 300)), T("kj", (300, 45))),
    ("blocked", [("k", "k")], "ij", T("ik", (37, 600)), T("jk", (70, 600))),
    ("blocked", [("k", "k")], "ij", T("ki", (7, 13)), T("kj", (7, 35))),
    ("blocked", [("k", "k")], "ij", T("ik", (6, 256)), T("kj", (256, 32))),
    ("blocked", [("k", "k")], "bij", T("bik", (3, 11, 260)), T("bkj", (3, 260, 17))),
    ("blocked", [("k", "k")], "bji", T("bik", (2, 9, 40)), T("jk", (33, 40))),
]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("form, pairs, out, lt, rt", MICRO_CASES)
def test_cpu_micro_kernels_match_reference(monkeypatch, dtype, form, pairs, out, lt, rt):
    seen = force_form(monkeypatch, form)
    lt, rt = (T(t.axes, t.sizes, dtype) for t in (lt, rt))
    node = bind(pairs, out, lt, rt, "activation")
    rng = np.random.default_rng(3)
    a, b = random_array(rng, lt), random_array(rng, rt)
    ot = node.output_type
    factor, base = random_array(rng, ot), random_array(rng, ot)
    want = base + reference(node, a, b) * factor
    got = np.full(ot.shape, np.nan, dtype)
    CONTRACT.kernels["cpu"](request_for(node, epilogue_for(node, ot)))([a, b], [factor, base], got)
    assert seen and all(seen)  # the micro-kernel computed the tiles, not BLAS
    close(got, want, lowering.lower(lt, rt, pairs).dims[3], np.dtype(dtype).type)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("form, pairs, out, lt, rt", [c for c in MICRO_CASES if c[0] == "bcast"])
def test_cpu_bcast_with_packed_left_rows_matches_reference(monkeypatch, dtype, form, pairs, out, lt, rt):
    """Every bcast block's left rows copied first into one interleaved buffer (the seed's
    h · Bᵀ does so: it has 64 panels), whatever the panel count."""
    from atoms.contract import micro

    monkeypatch.setattr(micro, "PACK_LEFT_MIN_PANELS", 0)
    test_cpu_micro_kernels_match_reference(monkeypatch, dtype, form, pairs, out, lt, rt)


@pytest.mark.slow  # (CI runs the slow set after the suite: README)
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layout=layouts(), seed=st.integers(0, 2**16), form=st.sampled_from(["dot", "bcast", "blocked"]))
def test_cpu_micro_kernels_any_layout(layout, seed, form):
    """Any axis order and operand memory (Fortran, strided, read-only): the micro-kernel where
    the layout allows, BLAS otherwise, the same values either way."""
    with pytest.MonkeyPatch.context() as mp:
        force_form(mp, form)
        test_cpu_matches_reference.hypothesis.inner_test(layout, seed)


def test_micro_forms_chosen_for_the_seed_shapes():
    from atoms.contract import micro
    from runtime.kernels import simd

    wide = simd.WIDE_BYTES == 64  # AVX-512: bcast in 64-byte vectors, from 5 rows on in x · Aᵀ
    # x · Aᵀ: on AVX2, packing A costs more than it saves unless the rows are many
    assert micro.choose_form(1, 128, 32, 1024) == ("bcast" if wide else "dot")
    assert micro.choose_form(1, 5, 32, 1024) == ("bcast" if wide else "dot")
    assert micro.choose_form(1, 8192, 32, 1024) == "bcast"
    assert micro.choose_form(1, 8192, 24, 1024) == "dot"  # no whole panels (of 16 or 32)
    assert micro.choose_form(1, 8192, 16, 1024, "float64") == "bcast"  # (panels of 8 or 16 in float64)
    assert micro.choose_form(1, 8192, 24, 1024, "float64") == ("dot" if wide else "bcast")
    short_k = "blocked" if wide else "bcast"  # (AVX-512's 4 x 4 tile is faster)
    assert micro.choose_form(1, 8192, 1024, 32) == short_k  # h · Bᵀ
    assert micro.choose_form(1, 256, 1024, 32) == short_k
    # from 5 rows on, whatever the rows (a chunked run's slices compute as the whole run)
    assert micro.choose_form(1, 16, 1024, 32) == micro.choose_form(1, 5, 1024, 32) == short_k
    assert micro.choose_form(1, 4, 1024, 32) is None  # (plan_tiles: gemv row by row)
    assert micro.choose_form(1, 512, 512, 512) == "blocked"  # the rest: the blocked GEMM
    assert micro.choose_form(1, 128, 2048, 512) == "blocked"  # (a block's MLP at 128 tokens)
    assert micro.choose_form(1, 512, 128, 512) is None  # narrow: BLAS as fast
    from atoms.contract import tiles

    # the seed's weight gradients at T=8192 (K-leading left operands): dA keeps the micro-kernel
    # form (the blocked tiles, with their column tiles, beat BLAS there); dB (narrow, long K)
    # and a batched one of few rows per batch (attention's dV) take BLAS
    assert tiles.form_for(1, 32, 1024, 8192, "float32", True, True) == micro.choose_form(1, 32, 1024, 8192) is not None
    assert tiles.form_for(1, 1024, 32, 8192, "float32", True, True) is None
    assert tiles.form_for(8, 64, 64, 512, "float32", True, True) is None
    assert micro.choose_form(1, 8, 512, 512) == micro.choose_form(1, 5, 512, 512) == "blocked"
    assert micro.usable("dot", 0, 1) and not micro.usable("dot", 1, 1) and micro.usable("bcast", 1, 0)
    assert micro.usable("blocked", 1, 0) and micro.usable("blocked", 0, 1)


def test_pack_rows_amortise_packing_a_large_right_operand():
    item = 4
    assert tiles.pack_rows(4096, 4096, 1024, item) == tiles.PACK_ROWS  # 16 MiB right operand
    assert tiles.pack_rows(100, 4096, 1024, item) == 100  # never more rows than there are
    assert tiles.pack_rows(4096, 256, 256, item) == 0  # 256 KiB: stays cached between tiles
    # a tile's result stays within WIDE_SCRATCH_BYTES (but at least 8 rows)
    assert tiles.pack_rows(4096, 1 << 20, 8, item) == 8
    assert tiles.pack_rows(4096, 16384, 64, item) == tiles.WIDE_SCRATCH_BYTES // (16384 * item)


@pytest.mark.parametrize("form", [None, "blocked"])
def test_cpu_wide_contraction_with_gelu_epilogue_uses_large_tiles_and_matches_reference(monkeypatch, form):
    """A right operand of 2 MiB: BLAS tiles of at least PACK_ROWS rows (not the 256 KiB
    scratch's 32; the blocked GEMM, this shape's form, packs it once), results as the
    reference with the exact gelu (vectorised erf) fused."""
    m, n, k = 700, 2048, 256
    assert micro_form(1, m, n, k) == "blocked"
    seen = force_form(monkeypatch, form)
    node = bind([("k", "k")], "ij", T("ik", (m, k)), T("jk", (n, k)))
    gelu = Epilogue((EpilogueStep(node, ScalarOp("(0.5 * {0} * (1.0 + math.erf({0} * 0.7071067811865476)))"),
                                  (CHAIN,)),), (), ())
    run = CONTRACT.kernels["cpu"](request_for(node, gelu))
    ints = run.compiled.params[0].value
    import numba

    if form is None:  # one tile per worker (700 rows in two tiles on two threads), not 22 tiles of 32 rows
        assert tiles.PACK_ROWS >= 350 and ints[render.I_TM] >= -(-m // max(2, numba.get_num_threads()))
    else:
        assert ints[render.I_FORM] == tiles.FORM_IDS["blocked"] and seen and all(seen)
    rng = np.random.default_rng(5)
    a, b = rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((n, k)).astype(np.float32) / 16
    got = np.empty((m, n), np.float32)
    run([a, b], [], got)
    from scipy.special import erf

    v = reference(node, a, b).astype(np.float64)
    close(got, 0.5 * v * (1 + erf(v / np.sqrt(2))), k)


@pytest.mark.parametrize("left, right, out, parallel", [
    (T("ik", (1, 1024)), T("jk", (32, 1024)), "ij", False),  # the seed at T=1
    (T("ik", (12, 64)), T("kj", (64, 40)), "ij", False),  # micro-kernel tiles packing B in the call
    (T(("B", "S", "D"), (2, 256, 64)), T("RD", (96, 64)), "BSR", True)])
def test_serial_plans_call_the_serial_entry_point_and_warm_builds_both(left, right, out, parallel):
    """A call too small for threads runs the kernel's serial twin: a parallel=True function
    costs about 2 µs a call even on its plain loop, a third of the seed's run at T=1.
    ``warm`` then builds the other twin, so an extent that crosses over compiles nothing."""
    pairs = [("D", "D")] if "D" in left.axes else [("k", "k")]
    node = bind(pairs, out, left, right)
    run = CONTRACT.kernels["cpu"](request_for(node))
    dispatcher = run.compiled.dispatcher()
    assert bool(dispatcher.targetoptions.get("parallel")) == parallel
    rng = np.random.default_rng(5)
    a, b = random_array(rng, left), random_array(rng, right)
    got = np.empty(node.output_type.shape, np.float32)
    run([a, b], [], got)
    close(got, reference(node, a, b), left.shape[-1])
    run.warm()
    module = __import__(dispatcher.py_func.__module__)
    assert module.kernel.signatures and module.kernel_serial.signatures == module.kernel.signatures


def test_the_finiteness_scan_of_a_small_value_is_serial():
    from runtime.kernels import finite

    finite.prepare(["float32", "float64"])
    assert finite.all_finite(np.ones(100, np.float32)) == True  # noqa: E712 (not None: the scan ran)
    assert finite.all_finite(np.array([1.0, np.nan] * 50)) == False  # noqa: E712
    assert finite.all_finite(np.ones(finite.PARALLEL_MIN, np.float32)) == True  # noqa: E712
    assert not finite._scans().serial.targetoptions.get("parallel")
    assert finite._scans().parallel.targetoptions.get("parallel")


@pytest.mark.parametrize("bad", [None, "left", "right"])
def test_a_weight_gradient_in_column_tiles_matches_reference_and_counts_both_operands(monkeypatch, bad):
    """dA = gᵀ·x with few rows: BLAS column tiles, one per thread (tiles.WGRAD_SPLIT_COLS;
    the rule's thresholds lowered so small shapes take it), with the seed's epilogue (factor
    and base over the output's columns), each column tile writing only its columns; the right
    operand scanned a share per worker, the left tile by tile, each once."""
    import numba

    if numba.get_num_threads() < 2:
        pytest.skip("one Numba thread: no column tiles")
    monkeypatch.setattr(tiles, "form_for", lambda *dims, **kw: None)  # (BLAS)
    monkeypatch.setattr(tiles, "WGRAD_SPLIT_COLS", 16)
    monkeypatch.setattr(tiles, "PARALLEL_MIN_MACS", 0)
    node = bind([("T", "T")], "RD", T("TR", (300, 24)), T("TD", (300, 200)))
    ot = node.output_type
    ft = T("D", (200,))
    ints = CONTRACT.kernels["cpu"](request_for(node, epilogue_for(node, ft))).compiled.params[0].value
    assert ints[render.I_FORM] == 0 and ints[render.I_TM] == 24 and ints[render.I_TN] < 200
    run = CONTRACT.kernels["cpu"](request_for(node, epilogue_for(node, ft), count_inputs=(0, 1)))
    rng = np.random.default_rng(9)
    g, x = random_array(rng, node.input_types[0]), random_array(rng, node.input_types[1])
    factor, base = random_array(rng, ft), random_array(rng, ot)
    if bad == "left":
        g[150, 3] = np.nan
    elif bad == "right":
        x[299, 199] = np.inf
    got = np.full(ot.shape, np.nan, np.float32)
    found = run([g, x], [align_to(factor, ft, ot), align_to(base, ot, ot)], got)
    assert bool(found) == (bad is not None)
    if bad is None:
        close(got, base + reference(node, g, x) * align_to(factor, ft, ot), 300)


@pytest.mark.parametrize("bad", [None, "left", "right"])
@pytest.mark.parametrize("m, n", [(100, 1000), (37, 300)])  # (BLOCKED_COLUMN_COLS lowered)
def test_a_short_blocked_product_in_column_tiles_is_the_row_tiles_bit_for_bit(monkeypatch, bad, m, n):
    """Few rows (tiles.BLOCKED_COLUMN_ROWS): a blocked tile per thread over whole panels of N,
    the last one partial, with the seed's epilogue (a factor over the output's columns, a base);
    bit for bit the plan
    in whole rows (each element one chain of FMAs in K order whichever tile holds it); the
    left operand scanned once (by the first column tile), the right a share per worker."""
    import numba

    if numba.get_num_threads() < 2:
        pytest.skip("one Numba thread: no column tiles")
    monkeypatch.setattr(tiles, "PARALLEL_MIN_MACS", 0)
    monkeypatch.setattr(tiles, "BLOCKED_COLUMN_COLS", 64)
    node = bind([("k", "k")], "ij", T("ik", (m, 520)), T("jk", (n, 520)))
    ot, ft = node.output_type, T("j", (n,))
    rng = np.random.default_rng(m)
    a, b = random_array(rng, node.input_types[0]), random_array(rng, node.input_types[1])
    factor, base = random_array(rng, ft), random_array(rng, ot)
    if bad == "left":
        a[m // 2, 7] = np.nan
    elif bad == "right":
        b[n - 1, 519] = np.inf
    got = {}
    for rows in (tiles.BLOCKED_COLUMN_ROWS, 0):  # column tiles, then whole rows
        monkeypatch.setattr(tiles, "BLOCKED_COLUMN_ROWS", rows)
        kernel = CONTRACT.kernels["cpu"](request_for(node, epilogue_for(node, ft), count_inputs=(0, 1)))
        ints = kernel.compiled.params[0].value
        assert ints[render.I_FORM] == tiles.FORM_IDS["blocked"]
        assert (ints[render.I_TN] < n) == bool(rows)
        got[rows] = np.full(ot.shape, np.nan, np.float32)
        found = kernel([a, b], [align_to(factor, ft, ot), base], got[rows])
        assert bool(found) == (bad is not None)
    if bad is None:
        assert np.array_equal(got[tiles.BLOCKED_COLUMN_ROWS], got[0])
        close(got[0], base + reference(node, a, b) * align_to(factor, ft, ot), 520)


@pytest.mark.parametrize("form, m, k, n", [("blocked", 70, 300, 200), ("blocked", 9, 257, 130),
                                           ("bcast", 40, 48, 300)])
def test_a_large_right_operand_is_packed_into_a_kept_buffer_with_the_same_bits(monkeypatch, form, m, k, n):
    """Past KEPT_PACK_BYTES (lowered here) the kernel packs its right operand into a buffer the
    runner keeps per thread (``micro == 3``), in every call, on Python launches and in a
    compiled call alike: the bits of the in-kernel pack into a new array; a second call over
    other values reuses the buffer and sees only its own values."""
    from collections import OrderedDict

    from atoms.contract import micro

    node = bind([("k", "k")], "ij", T("ik", (m, k)), T("kj", (k, n)))
    rng = np.random.default_rng(m)
    a, b = random_array(rng, node.input_types[0]), random_array(rng, node.input_types[1])
    b2 = random_array(rng, node.input_types[1])
    force_form(monkeypatch, form)
    got = {}
    for kept in (False, True):
        monkeypatch.setattr(micro, "KEPT_PACK_BYTES", 1 if kept else 1 << 60)
        monkeypatch.setattr(render, "_SOURCES", OrderedDict())
        kernel = CONTRACT.kernels["cpu"](request_for(node, EMPTY_EPILOGUE))
        params = kernel.compiled.params  # (12: micro, 13: bpk; factory._compiled_call)
        assert (params[12].value, params[13].kind) == ((3, "derived") if kept else (1, "array"))
        for which, right in (("first", b), ("second", b2)):
            out = np.empty((m, n), np.float32)
            kernel([a, right], [], out)
            got[kept, which] = out
    for which, right in (("first", b), ("second", b2)):
        assert np.array_equal(got[True, which], got[False, which])
        close(got[True, which], reference(node, a, right), k)


def test_kept_pack_buffers_are_one_per_thread_and_dtype():
    """Every kernel of every plan packs into its thread's one buffer of a dtype, grown to the
    largest size asked for: a plan at a new extent touches no new memory for it."""
    import threading

    from atoms.contract import micro

    small, large = micro.KeptBuffer(50, "float32"), micro.KeptBuffer(4000, "float32")
    got = {}

    def in_a_new_thread(name, fn):  # (a thread of its own: no buffer yet)
        thread = threading.Thread(target=lambda: got.__setitem__(name, fn()))
        thread.start()
        thread.join()

    def grow():
        first = micro.KeptBuffer(100, "float32")()
        assert first.size == 100 and np.shares_memory(first, small())
        grown = large()
        assert grown.size == 4000 and np.shares_memory(grown, small()) and not np.shares_memory(grown, first)
        wide = micro.KeptBuffer(50, "float64")()
        assert wide.dtype == np.float64 and not np.shares_memory(wide, grown)
        return grown

    in_a_new_thread("grown", grow)
    in_a_new_thread("other", small)
    assert got["other"].size == 50 and not np.shares_memory(got["other"], got["grown"])


def test_a_kept_pack_buffer_in_a_compiled_driver(monkeypatch):
    """The same in a plan's compiled driver (the buffer a derived argument): two products with
    large right operands in one driver pack into the thread's one buffer, one after the other."""
    import runtime
    from atoms.contract import micro
    from runtime.testing import ProgramBuilder, warm_drivers

    monkeypatch.setattr(micro, "KEPT_PACK_BYTES", 1)
    b = ProgramBuilder()
    x, w1, w2 = b.input("x", {"M": 40, "K": 300}), b.input("w1", {"K": 300, "N": 260}), b.input("w2", {"N": 260, "P": 270})
    f32 = {"accumulation_dtype": "float32"}
    h = b.op("contract", [x, w1], {"reduce_axes": [["K", "K"]], "output_axes": ["M", "N"], **f32})
    y = b.op("contract", [h, w2], {"reduce_axes": [["N", "N"]], "output_axes": ["M", "P"], **f32})
    prog = b.build(outputs=[y])
    rng = np.random.default_rng(4)
    inputs = {k: rng.standard_normal(v).astype(np.float32) for k, v in (("x", (40, 300)), ("w1", (300, 260)),
                                                                          ("w2", (260, 270)))}
    want = inputs["x"].astype(np.float64) @ inputs["w1"] @ inputs["w2"]
    exe = runtime.compile(prog, "cpu", tiered=False)
    (compiled,) = warm_drivers(exe, inputs)
    assert compiled.driver() is not None
    got = exe.run(inputs=inputs)[y]
    np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-3)


@pytest.mark.parametrize("m, k, n", [(9, 300, 200), (64, 257, 130)])
def test_the_blocked_tile_prefetches_the_next_panel_slice_and_computes_the_same_bits(monkeypatch, m, k, n):
    """BLOCKED_PREFETCH: each strip prefetches a share of the next panel's K slice (or the
    first panel's next slice); a hint only, so the bits are those of the tile without it."""
    from collections import OrderedDict

    from atoms.contract import micro

    assert micro.BLOCKED_PREFETCH and "vprefetch(m_bp, q)" in micro.blocked_tile("float32").text()
    node = bind([("k", "k")], "ij", T("ik", (m, k)), T("jk", (n, k)))
    rng = np.random.default_rng(11)
    a, b = random_array(rng, node.input_types[0]), random_array(rng, node.input_types[1])
    got = {}
    for on in (True, False):
        monkeypatch.setattr(micro, "BLOCKED_PREFETCH", on)
        monkeypatch.setattr(render, "_SOURCES", OrderedDict())  # (rendered sources name their tile's module)
        force_form(monkeypatch, "blocked")
        run = CONTRACT.kernels["cpu"](request_for(node, EMPTY_EPILOGUE))
        got[on] = np.empty((m, n), np.float32)
        run([a, b], [], got[on])
    assert np.array_equal(got[True], got[False])
    close(got[True], reference(node, a, b), k)


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_a_groups_addressing_kind_is_that_of_its_offsets(data):
    """``lowering.group_kind`` classifies a group from extents and strides alone; it agrees
    with the offsets themselves: all zero, ``arange(n)`` (unit), ``arange(n) * step`` (affine),
    else a table."""
    rank = data.draw(st.integers(1, 4))
    axes = tuple("abcd"[:rank])
    shape = tuple(data.draw(st.lists(st.sampled_from([1, 1, 2, 3, 5]), min_size=rank, max_size=rank)))
    if data.draw(st.booleans()):  # C-order strides, with some axes broadcast (0)
        strides = [0 if data.draw(st.booleans()) and rank > 1 else s for s in lowering.c_strides(shape)]
    else:
        strides = data.draw(st.lists(st.sampled_from([0, 1, 2, 3, 6, 15]), min_size=rank, max_size=rank))
    group = tuple(data.draw(st.permutations(axes + ("z",)))[:data.draw(st.integers(0, rank + 1))])
    offs = lowering.group_offsets(axes, group, shape, strides)
    step = int(offs[1] - offs[0]) if offs.size > 1 else 0
    if offs.size == 1 or not offs.any():
        want = ("zero", 0)
    elif np.array_equal(offs, np.arange(offs.size, dtype=np.int64) * step):
        want = ("unit" if step == 1 else "affine", step)
    else:
        want = ("table", 0)
    assert lowering.group_kind(axes, group, shape, strides) == want, (shape, strides, group, offs)
