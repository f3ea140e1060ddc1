"""Plugins as users meet them: installed (entry points), missing (unknown_atom with a pip
hint), broken (reported, the rest keeps working) and conflicting (plugin_conflict naming both)."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

import runtime
from runtime.plugins import diagnostics
from runtime.plugins.atomspec import AtomSpec
from runtime.core.errors import FormulaError
from runtime.plugins.hookspecs import hookimpl
from runtime.plugins.registry import Registry

from .fake_dists import GOOD_PLUGIN, fake_dist, forget_modules

HAVE_NORMS = importlib.util.find_spec("formula_norms") is not None
needs_norms = pytest.mark.skipif(not HAVE_NORMS, reason="formula-norms is not installed "
                                 "(pip install ./plugins/formula-norms; CI installs it)")
RMS_REF = "formula-norms/formula-atom-rms-norm@1"
NORMS_REFS = {RMS_REF, "formula-norms/formula-atom-layer-norm@1",
              "formula-norms/formula-atom-scalar-map-ext@1"}
BACKENDS_ONLY = ("runtime.backends",)  # a registry without the built-in atoms: quick, isolated


# --- installed ---------------------------------------------------------------------------
@needs_norms
def test_installed_plugin_is_found_through_its_entry_point():
    registry = Registry(autoload=True, builtins=BACKENDS_ONLY)
    assert NORMS_REFS <= set(registry.atoms)
    owner = registry.atom_owner[RMS_REF]
    assert (owner.name, owner.distribution) == ("formula_norms", "formula-norms")
    assert owner.version  # from the installed metadata


@needs_norms
def test_autoload_can_be_switched_off(monkeypatch):
    monkeypatch.setenv("FORMULA_DISABLE_PLUGIN_AUTOLOAD", "1")
    assert RMS_REF not in Registry(builtins=BACKENDS_ONLY).atoms


# --- not installed: the unknown_atom hint --------------------------------------------------
def test_known_plugins_data_names_the_distribution_of_every_norms_atom():
    data = json.loads((Path(runtime.__file__).parent / "plugins" / "known_plugins.json").read_text())
    assert {f"{family}@1" for family, dist in data.items() if dist == "formula-norms"} == NORMS_REFS
    if HAVE_NORMS:
        import formula_norms

        assert {r for s in formula_norms.SPECS for r in s.refs} == NORMS_REFS


@pytest.mark.parametrize("ref", sorted(NORMS_REFS))
def test_uninstalled_plugin_atom_suggests_pip_install(ref):
    registry = Registry(autoload=False, builtins=BACKENDS_ONLY)
    with pytest.raises(FormulaError) as e:
        registry.atom(ref, "$.instructions[0].atom_ref")
    assert e.value.code == "unknown_atom" and e.value.path == "$.instructions[0].atom_ref"
    assert "pip install formula-norms" in e.value.message and ref in e.value.message


def test_unrelated_unknown_atom_gets_no_pip_hint():
    registry = Registry(autoload=False, builtins=BACKENDS_ONLY)
    with pytest.raises(FormulaError) as e:
        registry.atom("someone/formula-atom-nothing@1", "$.x")
    assert e.value.code == "unknown_atom" and "pip install" not in e.value.message


@needs_norms
def test_loading_a_program_without_the_plugin_fails_with_the_hint():
    from runtime.testing import ProgramBuilder

    full = Registry(autoload=True, builtins=("atoms", "runtime.backends"))
    b = ProgramBuilder(registry=full)
    x = b.input("x", {"T": "T", "D": 4})
    y = b.op(RMS_REF, [x], {"axis": "D", "epsilon": 1e-5, "accumulation_dtype": "float32"})
    program = b.build(outputs=[y])
    runtime.load_program(program, registry=full)  # valid where the plugin is present
    bare = Registry(autoload=False)
    with pytest.raises(FormulaError) as e:
        runtime.load_program(program, registry=bare)
    assert e.value.code == "unknown_atom" and e.value.path == "$.instructions[0].atom_ref"
    assert "pip install formula-norms" in e.value.message


# --- broken plugins ----------------------------------------------------------------------
@pytest.fixture
def site(tmp_path, monkeypatch):
    """A folder on sys.path that fake distributions are installed into."""
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    forget_modules(("fake",))


def test_broken_plugins_are_reported_and_the_rest_keeps_working(site):
    bad_import = fake_dist(site, "fake-import", "raise ImportError('needs libfoo >= 2')\n")
    bad_spec = fake_dist(site, "fake-spec", '''
        from runtime.plugins.atomspec import AtomSpec
        from runtime.plugins.hookspecs import hookimpl

        @hookimpl
        def formula_register_atoms(register):
            register(AtomSpec(name="oops", refs=("not a reference",), inputs=("value",),
                              attributes=frozenset(), infer=lambda ctx: ctx.operands[0]))
        ''')
    not_a_spec = fake_dist(site, "fake-object", '''
        from runtime.plugins.hookspecs import hookimpl

        @hookimpl
        def formula_register_atoms(register):
            register({"name": "a dict is not an AtomSpec"})
        ''')
    bad_view = fake_dist(site, "fake-view", '''
        from runtime.plugins.atomspec import AtomSpec
        from runtime.plugins.hookspecs import hookimpl

        @hookimpl
        def formula_register_atoms(register):
            register(AtomSpec(name="pair-view", refs=("fake-view/formula-atom-pair-view@1",),
                              inputs=("a", "b"), attributes=frozenset(), infer=lambda ctx: ctx.operands[0],
                              view=True))
        ''')
    raising = fake_dist(site, "fake-raise", '''
        from runtime.plugins.hookspecs import hookimpl

        @hookimpl
        def formula_register_atoms(register):
            raise RuntimeError("hook exploded")
        ''')
    good = fake_dist(site, "fake-good", GOOD_PLUGIN.format(owner="fake-good"))

    registry = Registry(autoload=True, builtins=BACKENDS_ONLY)
    problems = {p.plugin: p.error for p in registry.problems}
    assert problems[f"{bad_import} (fake-import 1.0)"] == "import failed: ImportError: needs libfoo >= 2"
    assert "malformed references ('not a reference',)" in problems[f"{bad_spec} (fake-spec 1.0)"]
    assert "is not an AtomSpec" in problems[f"{not_a_spec} (fake-object 1.0)"]
    assert "RuntimeError: hook exploded" in problems[f"{raising} (fake-raise 1.0)"]
    assert "declares view=True; a view atom has exactly one operand (it has 2)" in \
        problems[f"{bad_view} (fake-view 1.0)"]
    assert not any(r.startswith("fake-spec/") or "oops" == s.name for r, s in registry.atoms.items())
    for name in (bad_import, bad_spec, not_a_spec, raising, bad_view):
        assert name not in registry.plugins

    # the healthy plugin (and any installed one) still works
    assert "fake-good/formula-atom-double@1" in registry.atoms
    assert registry.plugins[good].distribution == "fake-good"
    if HAVE_NORMS:
        assert NORMS_REFS <= set(registry.atoms)

    # and an unknown atom now also points at the plugins that failed
    with pytest.raises(FormulaError) as e:
        registry.atom("fake-spec/formula-atom-oops@1", "$.instructions[0].atom_ref")
    assert "plugins that failed to load" in e.value.message and bad_spec in e.value.message

    # `formula plugins` shows every failure with its error
    rows = {r["name"]: r for r in diagnostics.plugins_report(registry)}
    assert rows[f"{bad_import} (fake-import 1.0)"]["status"] == "failed"
    text = diagnostics.format_plugins(diagnostics.plugins_report(registry))
    assert f"{bad_import} (fake-import 1.0)  FAILED" in text and "needs libfoo >= 2" in text
    assert "5 failed to load" in text


@needs_norms
def test_an_installed_plugin_claiming_anothers_reference_is_a_conflict(site):
    fake_dist(site, "fake-clash", GOOD_PLUGIN.format(owner="fake-clash").replace(
        '"fake-clash/formula-atom-double@1"', f'"{RMS_REF}"'), version="2.5")
    with pytest.raises(FormulaError) as e:
        Registry(autoload=True, builtins=BACKENDS_ONLY)
    assert e.value.code == "plugin_conflict" and RMS_REF in e.value.message
    assert "fake-clash 2.5" in e.value.message and "formula-norms" in e.value.message


# --- conflicts through the shipped register_plugin fixture --------------------------------
def _plugin_claiming(ref: str):
    class Plugin:
        @hookimpl
        def formula_register_atoms(self, register):
            register(AtomSpec(name="claim", refs=(ref,), inputs=("value",), attributes=frozenset(),
                              infer=lambda ctx: ctx.operands[0]))
    return Plugin()


def test_two_plugins_claiming_one_reference(register_plugin, formula_registry):
    ref = "conflict-test/formula-atom-claim@1"
    register_plugin(_plugin_claiming(ref), name="claimer_one", distribution="dist-one")
    with pytest.raises(FormulaError) as e:
        register_plugin(_plugin_claiming(ref), name="claimer_two", distribution="dist-two")
    assert e.value.code == "plugin_conflict" and e.value.path == "plugins.claimer_two"
    assert ref in e.value.message and "dist-one" in e.value.message and "dist-two" in e.value.message
    assert formula_registry.atom_owner[ref].distribution == "dist-one"  # the first one stays
    assert "claimer_two" not in formula_registry.plugins


def test_a_plugin_cannot_take_over_a_builtin_reference(register_plugin):
    with pytest.raises(FormulaError) as e:
        register_plugin(_plugin_claiming("arti/formula-atom-add@1"), name="usurper", distribution="evil")
    assert e.value.code == "plugin_conflict"
    assert "formula-runtime" in e.value.message and "evil" in e.value.message
