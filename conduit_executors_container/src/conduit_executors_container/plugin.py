"""Entry point module of conduit-executors-container (group ``conduit``, name ``container``).

The package registers nothing yet; its issue adds the implementation and declares it in
``conduit-manifest.toml``.
"""
