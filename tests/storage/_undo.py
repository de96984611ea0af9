"""Schema changes undone, shared by the tests that make a store look like an earlier conduit
left it (each undoes the later versions first, newest first)."""

#: Schema 20 undone: the ready index per binding and scope as V16 made it (V20's names
#: ``key_parked``, which the undoing of V19 drops).
UNDO_V20 = (
    "DROP INDEX conduit_work_ready_binding",
    "CREATE INDEX conduit_work_ready_binding ON conduit_work (binding, scope, ready_since) "
    "WHERE claimable = 1",
)
