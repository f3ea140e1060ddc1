"""Running a plan: binding values (SPEC §4), bank operands and stores, resident banks, the
kernel launches and compiled driver, result memory."""
