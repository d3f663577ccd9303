"""fermix for Hermes Agent (I1): a memory provider, and the command that installs it.

- :mod:`.provider`: ``FermixMemoryProvider``, Hermes's ``MemoryProvider`` over a
  :class:`fermix.Memory` or a :class:`fermix.Client`; it imports ``hermes-agent`` at its
  top (the ``fermix[hermes]`` extra, or Hermes's own environment).
- :mod:`.install`: ``fermix hermes install`` writes ``$HERMES_HOME/plugins/fermix/``, whose
  ``__init__.py`` imports the provider; no Hermes import.
- :mod:`.settings`: ``$HERMES_HOME/fermix.json`` and ``FERMIX_TOKEN``; no Hermes import.
- :mod:`.turns`: a Hermes turn as fermix's appends; pure.

This package's own module imports none of them, so the command line can install the
plugin where Hermes is not installed.
"""
