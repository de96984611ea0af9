"""Test-only conduit plugin."""
