"""From a program and extents to a plan: resolved types, fusion groups and epilogues, slot
lifetimes, arena offsets and the memory preflight (SPEC §5)."""
