"""Gradients as programs (SPEC §3c): ``vjp``/``grad`` transform a program into one that
computes its vector-Jacobian product; the rules come from each atom's plugin."""
from runtime.autodiff.context import VjpContext
from runtime.autodiff.transform import Gradient, grad, vjp

__all__ = ["Gradient", "VjpContext", "grad", "vjp"]
