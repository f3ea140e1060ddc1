"""The generated fused-elementwise kernels (CPU and CUDA) on hand-built chains of the
elementwise atoms' own ScalarOps, against running the reference kernels one by one."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from atoms.elementwise import SPECS
from runtime.plugins.atomspec import bind_node
from runtime.plugins.kernel import KernelRequest
from runtime.backends import cpu_codegen
from runtime.backends.cuda_codegen import align_device
from runtime.backends.cuda_codegen import elementwise_kernel as cuda_kernel
from runtime.core.errors import FormulaError
from runtime.plan.fusion import CHAIN, Epilogue, EpilogueStep
from runtime.kernels.layout import align_to
from runtime.core.types import TensorType

SPEC = {s.name: s for s in SPECS if s.ref.endswith("@1")}  # scalar-map@2 has the same name
ACT = {"accumulation_dtype": "activation"}


def T(axes, sizes, dtype="float32"):
    return TensorType(tuple(axes), tuple(sizes), dtype, "d")


def chain(links, extra_types):
    """``links``: (atom, attributes, operand types, sources) per step -> Epilogue, nodes."""
    steps, nodes = [], []
    for k, (name, attributes, types, sources) in enumerate(links):
        node = bind_node(SPEC[name], attributes, types, index=k)
        steps.append(EpilogueStep(node, node.atom.elementwise(node), tuple(sources)))
        nodes.append(node)
    return Epilogue(tuple(steps), tuple(f"x{j}" for j in range(len(extra_types))), tuple(extra_types)), nodes


def sequential(epilogue, nodes, extras):
    """The chain by the reference kernels, one node at a time."""
    value = None
    for step, node in zip(epilogue.steps, nodes):
        operands = [value if s == CHAIN else extras[s] for s in step.sources]
        out = np.empty(node.output_type.shape, dtype=operands[-1].dtype if node.atom.name == "select"
                       else operands[0].dtype)
        node.atom.kernels["reference"](KernelRequest(node))(operands, (), out)
        value = out
    return value


def run_cpu(epilogue, out_type, extras, dtype):
    out = np.empty(out_type.shape, dtype=dtype)
    kernel = cpu_codegen.elementwise_kernel(KernelRequest(None, epilogue))
    kernel((), [align_to(x, t, out_type) for x, t in zip(extras, epilogue.extra_types)], out)
    return out


def run_cuda(epilogue, out_type, extras, dtype):
    from numba import cuda

    out = cuda.device_array(out_type.shape, dtype=dtype)
    kernel = cuda_kernel(KernelRequest(None, epilogue))
    kernel((), [align_device(cuda.to_device(np.array(x, order="C")), t, out_type)
                for x, t in zip(extras, epilogue.extra_types)], out)
    return out.copy_to_host()


def seed_chain(sizes, dtype="float32"):
    """base + gain * silu(x): the seed's epilogue, with gain broadcast over T."""
    xt, gt = T("TD", sizes, dtype), T("D", sizes[1:], dtype)
    return chain([("scale", {"factor_axes": ["D"], **ACT}, [xt, gt], (0, 1)),
                  ("scalar-map", {"mode": "silu"}, [xt], (CHAIN,)),
                  ("add", ACT, [xt, xt], (2, CHAIN))], [xt, gt, xt]), xt


@settings(deadline=None, max_examples=8)
@given(seed=st.integers(0, 2**16), sizes=st.tuples(st.integers(2, 9), st.integers(2, 9)),
       layout=st.sampled_from(["c", "fortran", "strided"]))
def test_three_step_chain_cpu(seed, sizes, layout):
    (epilogue, nodes), xt = seed_chain(list(sizes))
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(sizes).astype(np.float32) * 4
    g = rng.standard_normal(sizes[1:]).astype(np.float32)
    base = rng.standard_normal(sizes).astype(np.float32)
    if layout == "fortran":
        x = np.asfortranarray(x)
    elif layout == "strided":
        x = np.repeat(x, 2, axis=1)[:, ::2]
        x.flags.writeable = False
    before = x.copy()
    want = sequential(epilogue, nodes, [x, g, base])
    np.testing.assert_allclose(run_cpu(epilogue, xt, [x, g, base], np.float32), want, rtol=2e-6, atol=1e-6)
    np.testing.assert_array_equal(x, before)


def test_three_step_chain_cuda():
    (epilogue, nodes), xt = seed_chain([3, 5], "float64")
    rng = np.random.default_rng(1)
    x, g, base = rng.standard_normal((3, 5)), rng.standard_normal(5), rng.standard_normal((3, 5))
    want = sequential(epilogue, nodes, [x, g, base])
    np.testing.assert_allclose(run_cuda(epilogue, xt, [x, g, base], np.float64), want, rtol=1e-13, atol=1e-15)


def test_select_chain_with_broadcast_mask_and_permuted_operand():
    vt = T("ABC", [2, 3, 4])
    mt = T("CA", [4, 1], "boolean")
    pt = T("CBA", [4, 3, 2])  # same axes, other order: permuted to the output's by name
    epilogue, nodes = chain([("scalar-map", {"mode": "gelu"}, [vt], (0,)),
                             ("select", {}, [mt, vt, vt], (1, CHAIN, 2))], [vt, mt, vt])
    rng = np.random.default_rng(2)
    x = rng.standard_normal(vt.shape).astype(np.float32)
    m = rng.random(mt.shape) < 0.5
    p = rng.standard_normal(pt.shape).astype(np.float32)
    other = align_to(p, pt, vt)
    want = sequential(epilogue, nodes, [x, m, np.ascontiguousarray(other)])
    got = run_cpu(epilogue, vt, [x, m, other], np.float32)
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-6)
    np.testing.assert_allclose(run_cuda(epilogue, vt, [x, m, np.ascontiguousarray(other)], np.float32),
                               want, rtol=2e-6, atol=1e-6)


def test_rank0_chain():
    t = T([], [], "float64")
    epilogue, nodes = chain([("add", ACT, [t, t], (0, 1)), ("scalar-map", {"mode": "rsqrt"}, [t], (CHAIN,))], [t, t])
    a, b = np.array(1.5), np.array(2.5)
    assert run_cpu(epilogue, t, [a, b], np.float64)[()] == 0.5
    assert run_cuda(epilogue, t, [a, b], np.float64)[()] == 0.5


def test_parallel_variant_matches_serial(monkeypatch):
    (epilogue, nodes), _ = seed_chain([4, 64])
    xt = T("TD", [4, 64])
    rng = np.random.default_rng(3)
    extras = [rng.standard_normal((4, 64)).astype(np.float32), rng.standard_normal(64).astype(np.float32),
              rng.standard_normal((4, 64)).astype(np.float32)]
    serial = run_cpu(epilogue, xt, extras, np.float32)
    monkeypatch.setattr(cpu_codegen, "PARALLEL_MIN_ELEMENTS", 1)
    monkeypatch.setattr(cpu_codegen, "MIN_BLOCK", 8)  # split rows too: exercise the block path
    np.testing.assert_array_equal(run_cpu(epilogue, xt, extras, np.float32), serial)


@pytest.mark.parametrize("parallel", [False, True])
def test_an_operand_in_the_outputs_memory_is_read_through_the_output(monkeypatch, parallel):
    """In-place reuse: extra 0 is the output's own buffer, read through ``out``. Read as a
    second array, the loop's vector path is guarded by an overlap check that this overlap
    fails, so it ran scalar (10x slower for a silu chain)."""
    import inspect
    import re

    (epilogue, nodes), xt = seed_chain([4, 64])
    rng = np.random.default_rng(4)
    x = rng.standard_normal((4, 64)).astype(np.float32)
    g, base = rng.standard_normal(64).astype(np.float32), rng.standard_normal((4, 64)).astype(np.float32)
    want = sequential(epilogue, nodes, [x, g, base])
    if parallel:
        monkeypatch.setattr(cpu_codegen, "PARALLEL_MIN_ELEMENTS", 1)
    kernel = cpu_codegen.elementwise_kernel(KernelRequest(None, epilogue, output_extras=(0,)))
    out = x.copy()  # the output is operand 0's buffer
    kernel((), [align_to(v, t, xt) for v, t in zip([out, g, base], epilogue.extra_types)], out)
    np.testing.assert_allclose(out, want, rtol=2e-6, atol=1e-6)
    twin = kernel.warm.__self__  # (Kernel.warm is its NestKernel's)
    source = inspect.getsource((twin.parallel() if parallel else twin.serial).py_func)
    assert "x0[" not in source and re.search(r"_e0 = out\[i0, i1\]", source)  # read where it is written


def test_generated_source_is_cached_as_a_file_and_reused():
    from runtime.kernels.codegen import cache_dir

    (epilogue, _), xt = seed_chain([2, 3])
    k1 = cpu_codegen.elementwise_kernel(KernelRequest(None, epilogue))
    k2 = cpu_codegen.elementwise_kernel(KernelRequest(None, epilogue))
    files = list((cache_dir() / "generated").glob("_formula_ew_*.py"))
    assert files and any(epilogue.key in f.read_text() for f in files)
    out1, out2 = np.empty((2, 3), np.float32), np.empty((2, 3), np.float32)
    ones = [np.ones((2, 3), np.float32), np.ones(3, np.float32), np.ones((2, 3), np.float32)]
    extras = [align_to(x, t, xt) for x, t in zip(ones, epilogue.extra_types)]
    k1((), extras, out1)
    k2((), extras, out2)
    np.testing.assert_array_equal(out1, out2)


def test_unsupported_dtype_is_backend_unavailable():
    (epilogue, nodes), xt = seed_chain([2, 3], "float16")
    for make in (cpu_codegen.elementwise_kernel, cuda_kernel):
        with pytest.raises(FormulaError) as info:
            make(KernelRequest(None, epilogue))
        assert info.value.code == "backend_unavailable"
        assert info.value.path == nodes[-1].path and "float16" in info.value.message


def test_parallel_nest_calls_take_their_tasks_from_a_ticket(monkeypatch):
    """The parallel twin gives the serial kernel's values, its workers taking chunks of rows
    from a shared ticket (not Numba's chunk size: under the omp layer it deals chunks out
    statically)."""
    import numba

    (epilogue, nodes), _ = seed_chain([64, 64])
    xt = T("TD", [64, 64])
    rng = np.random.default_rng(4)
    extras = [rng.standard_normal((64, 64)).astype(np.float32), rng.standard_normal(64).astype(np.float32),
              rng.standard_normal((64, 64)).astype(np.float32)]
    serial = run_cpu(epilogue, xt, extras, np.float32)
    monkeypatch.setattr(numba, "set_parallel_chunksize", None)  # (not used any more)
    monkeypatch.setattr(cpu_codegen, "PARALLEL_MIN_ELEMENTS", 1)
    np.testing.assert_array_equal(run_cpu(epilogue, xt, extras, np.float32), serial)
    assert "_take(ticket)" in cpu_codegen.render("k", [("x", "float32", 1, True)],
                                                 cpu_codegen.loop_nest(["x.shape[0]"], ["x[i0] = 1"], True), True)


@pytest.mark.parametrize("count, chunks", [(0, 16), (1, 16), (5, 16), (64, 16), (1000, 16), (37, 1), (3, 3), (100, 7)])
def test_dynamic_tasks_run_every_task_exactly_once(count, chunks):
    from numba import njit, prange

    from runtime.kernels.atomic import left, take
    from runtime.toolkit.cpu import Source

    src = Source()
    with src.block("def run(hits):"):
        src.add(cpu_codegen.dynamic_tasks("hits.shape[0]", ["hits[t] += 1"], chunks))
    scope = dict(np=np, prange=prange, _left=left, _take=take)
    exec(src.text(), scope)
    run = njit(parallel=True)(scope["run"])
    hits = np.zeros(count, np.int64)
    run(hits)
    assert (hits == 1).all()


def test_kernels_of_one_source_share_their_parallel_twin():
    """A plan at a new extent builds its kernels again: each takes the parallel twin that an
    earlier kernel of the same serial source loaded, without rendering its source again."""
    (epilogue, _), _ = seed_chain([2, 3])
    made = []

    def source(parallel: bool, tag: str = "") -> str:
        made.append(parallel)
        return cpu_codegen.render(f"twin test {tag}", [("out", "float32", 1, True)],
                                  cpu_codegen.loop_nest(["out.shape[0]"], ["out[i0] = 1.0"], parallel), parallel)

    first = cpu_codegen.NestKernel("ew", source)
    second = cpu_codegen.NestKernel("ew", source)
    assert first.parallel() is second.parallel() and made == [False, False, True]
    other = cpu_codegen.NestKernel("ew", lambda parallel: source(parallel, "other"))
    assert other.parallel() is not first.parallel() and made[-1] is True  # another source: its own


def test_an_elementwise_kernel_of_the_same_chain_at_another_extent_is_the_same_kernel():
    """A plan at a new extent asks for the same chain's kernel again: it gets the one made
    before, its source neither rendered nor hashed again (``NestKernel.shared``)."""
    made = []
    render = cpu_codegen.render
    (epilogue, _), _ = seed_chain([2, 3])
    first = cpu_codegen.elementwise_kernel(KernelRequest(None, epilogue))
    cpu_codegen.render = lambda *a, **k: made.append(1) or render(*a, **k)
    try:
        (epilogue5, _), _ = seed_chain([5, 3])
        again = cpu_codegen.elementwise_kernel(KernelRequest(None, epilogue5))
    finally:
        cpu_codegen.render = render
    assert made == [] and again.warm.__self__ is first.warm.__self__
