"""Adapters of fermix to the frameworks hosts are built on (I1-I6): thin shells over the
facades (:class:`~fermix.api.Memory` and :class:`~fermix.remote.Client`, through
:mod:`fermix.surface`), each in its own module behind its own optional extra.

Importing this package imports no framework; ``from fermix import Memory`` imports none of
these modules. Each module imports its framework at its top, so a missing extra fails with
the framework's ``ModuleNotFoundError`` naming the package to install.
"""
