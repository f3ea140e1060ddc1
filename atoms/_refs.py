"""References of the built-in atoms: the versioned ref, plus the seed's digest aliases."""
from __future__ import annotations

SEED_DIGESTS = {
    "contract": "0e64cc2f8e26fe31dae10c4920b2d160df426b04a707c712bbaba5a8c6b38260",
    "scalar-map": "e7cee82be840d3f58c0fe9d91492263cb6e57429036eda39b1450a0655cc7fef",
    "scale": "739d9ea89c2f37107ca608a3b8a30c4bfbda09cc5889be2487221adc22db8de7",
    "add": "21af44bb3290662b7e7f695b0096c9359c94f9db75272504351bb84e68a1b4d9",
}


def refs_for(name: str, version: int = 1) -> tuple[str, ...]:
    """``arti/formula-atom-<name>@<version>``, then the seed's digest alias for a v1 seed atom."""
    refs = [f"arti/formula-atom-{name}@{version}"]
    if version == 1 and name in SEED_DIGESTS:
        refs.append(f"arti/formula-atom-{name}@sha256:{SEED_DIGESTS[name]}")
    return tuple(refs)
