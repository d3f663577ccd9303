"""The pure core: the rules fermix decides by, with no I/O, no SQL and no threads.

Categories and scopes (:mod:`~fermix.core.categories`), rendering of USER.md and MEMORY.md
(:mod:`~fermix.core.render`), the composer, the reviewer's gate and prompt
(:mod:`~fermix.core.review`), the model's answer and its parser
(:mod:`~fermix.core.review_answer`), admission (:mod:`~fermix.core.review_admission`),
compaction planning, chat commands and the memory tools' schemas and argument checks. A
rule's test needs no thread and no file.
"""
