"""The memory core: categories and scopes, rendering of USER.md / MEMORY.md, the composer.

Pure rules live in :mod:`~fermix.memory.categories` and :mod:`~fermix.memory.render`;
:mod:`~fermix.memory.prompt_files` is the one module here that touches files.
"""
