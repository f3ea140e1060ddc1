"""A program as the format defines it (SPEC §2): records, the loader of untrusted JSON, and
the validation of the rules between records, each instruction typed through its atom (§3)."""
