"""What plugins give and how they are found: the hooks, AtomSpec (an atom's contract,
type inference and kernels), the registry, and the reports of `formula atoms` / `formula plugins`."""
