"""The names of the test-only switch variables: the one place shipped code names them.

Only a test-only distribution's provider reads them (``extension/_switches.py``); a conduit
process that finds one set without a provider refuses to start. The CLI checks whether any is
set before it loads the extension layer, so the names live here, in a module of no imports.
"""

__all__ = ["FAULT_VARIABLE", "SWITCH_VARIABLES", "UNSAFE_VARIABLE"]

#: Names protections to switch off (``extension._switches.PROTECTIONS``).
UNSAFE_VARIABLE = "CONDUIT_TEST_UNSAFE"
#: Names fault points (``shell.after_spawn:kill``, ``store.capacity_counted:sleep=0.3``, …).
FAULT_VARIABLE = "CONDUIT_TEST_FAULT"
SWITCH_VARIABLES = (UNSAFE_VARIABLE, FAULT_VARIABLE)
