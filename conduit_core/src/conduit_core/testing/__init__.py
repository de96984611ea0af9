"""Test kits conduit ships for plugin authors (pytest is needed to use them, not to import this).

- :mod:`conduit_core.testing.executor`: the executor conformance suite. An executor package
  provides an ``executor_subject`` fixture and imports the cases into one of its test modules.
- :mod:`conduit_core.storage.conformance`: the storage backend suite (kept beside the storage
  contract it checks).
"""
