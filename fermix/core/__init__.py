"""The memory core: categories and scopes, rendering of USER.md / MEMORY.md, the composer.

Pure rules live in :mod:`~fermix.core.categories` and :mod:`~fermix.core.render`;
:mod:`~fermix.runtime.prompt_files` is the one module here that touches files.
"""
