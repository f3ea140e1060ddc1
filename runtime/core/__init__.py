"""The vocabulary every layer shares: FormulaError and its codes (SPEC §6), component
references (§1), named-axis tensor types and dtypes (§2)."""
