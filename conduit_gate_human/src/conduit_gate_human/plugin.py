"""Entry point module of conduit-gate-human (group ``conduit``, name ``human``).

The package registers nothing yet; its issue adds the implementation and declares it in
``conduit-manifest.toml``.
"""
