"""``fermix setup``: a wizard that writes config.toml (E8, K2, V1).

It asks for the model route (primary, fallbacks, api_base, and the NAME of the environment
variable holding the key, never the key), the review interval, compaction and voice
transcripts, starting from the current values. Each answer is checked as loading the file
checks it (and an ``api_key_env`` that looks like a key is refused); a bad answer is asked
again and never written. It can test the route with one tiny model call, shows the file it
will write, and writes it atomically after a confirmation. An existing file is edited in
place, so its comments stay; a new one lists every key, commented out at its default.
``--non-interactive`` takes the answers from flags instead, for scripts.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from rich.console import Console
from rich.markup import escape
from tomlkit import TOMLDocument

from fermix.cli.config_cmd import checked_value, usage_error
from fermix.cli.config_file import (
    check_document,
    defaults_toml,
    document_values,
    parse_document,
    read_document,
    set_document_value,
    unset_document_value,
    write_document,
)
from fermix.cli.context import CommandContext
from fermix.cli.output import console
from fermix.config import KEYS, Config, load_config, parse_value
from fermix.errors import ConfigError, FermixError, InvalidInputError

CLEAR = "-"
"""The answer that clears an optional value (back to unset)."""


@dataclass(frozen=True)
class Question:
    """One question of the wizard: the key it sets, how it is asked, how its answer is read."""

    key: str
    label: str
    kind: Literal["text", "list", "value", "bool"]
    optional: bool = False
    """Whether ``-`` (or an empty answer with nothing to keep) clears the key."""


PRIMARY = Question(
    "fermix_core.model.primary",
    "Primary model, a litellm name such as openai/gpt-4o-mini (- for none)",
    "text",
    optional=True,
)
MODEL = (
    PRIMARY,
    Question(
        "fermix_core.model.fallbacks",
        "Fallback models, comma-separated (- for none)",
        "list",
        optional=True,
    ),
    Question(
        "fermix_core.model.api_base",
        "API base URL, for a local or proxy server (- for the provider's own)",
        "text",
        optional=True,
    ),
    Question(
        "fermix_core.model.api_key_env",
        "Name of the environment variable holding the API key, not the key (- for none)",
        "text",
        optional=True,
    ),
)
INTERVAL = Question(
    "fermix_core.memory.review_interval_hours",
    "Hours between background reviews of a conversation (0 disables them)",
    "value",
)
COMPACTION = Question(
    "fermix_core.compaction.enabled", "Compact long conversations into a summary?", "bool"
)
THRESHOLD = Question(
    "fermix_core.compaction.threshold",
    "Compact when the prompt reaches this fraction of the context window (0-1]",
    "value",
)
VOICE = Question(
    "fermix_core.realtime.persist_transcripts", "Store voice (realtime) transcripts?", "bool"
)
QUESTIONS = (*MODEL, INTERVAL, COMPACTION, THRESHOLD, VOICE)
"""Every question, in the order the wizard asks them."""

Answers = dict[str, object]
"""Dotted key to the TOML value answered, None for unset."""


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``setup`` command."""
    p = sub.add_parser(
        "setup",
        help="a wizard that writes config.toml (or --non-interactive)",
        description="Write config.toml: the model route, review interval, compaction and voice"
        " transcripts. Starts from the current values; Enter keeps one, - clears an optional"
        " one. Without --non-interactive it asks on the terminal.",
    )
    p.add_argument(
        "--non-interactive", action="store_true", help="take the answers from flags, ask nothing"
    )
    p.add_argument("--model", metavar="MODEL", help="primary litellm model (- for none)")
    p.add_argument(
        "--fallback",
        metavar="MODEL",
        action="append",
        help="a fallback model (repeatable; - for none)",
    )
    p.add_argument(
        "--api-base", metavar="URL", help="model server base URL (- for the provider's own)"
    )
    p.add_argument(
        "--api-key-env",
        metavar="NAME",
        help="NAME of the variable holding the API key (- for none)",
    )
    p.add_argument(
        "--review-interval-hours", metavar="HOURS", help="hours between reviews (0 disables them)"
    )
    p.add_argument("--compaction", action=argparse.BooleanOptionalAction, help="compaction on/off")
    p.add_argument(
        "--compaction-threshold",
        metavar="FRACTION",
        help="fraction of the context window, in (0, 1]",
    )
    p.add_argument("--voice", action=argparse.BooleanOptionalAction, help="store voice transcripts")
    p.add_argument(
        "--test-model", action="store_true", help="test the route with one tiny call first"
    )
    p.set_defaults(handler=cmd_setup)


def interpret(question: Question, text: str) -> object:
    """The value an answer means, checked as at load; :class:`InvalidInputError` if refused."""
    text = text.strip()
    if question.optional and text in ("", CLEAR):
        return None
    value: object
    if question.kind == "list":
        value = [item.strip() for item in text.split(",") if item.strip()]
    elif question.kind == "text":
        value = text
    else:
        value = parse_value(text)
    checked_value(question.key, value)
    return value


def starting_answers(config: Config, in_file: Mapping[str, object]) -> Answers:
    """Each question's current value: as the file spells it, else the effective default."""
    answers: Answers = {}
    for question in QUESTIONS:
        _, section, name = question.key.split(".")
        value = in_file.get(question.key, getattr(getattr(config, section), name))
        answers[question.key] = list(value) if isinstance(value, tuple) else value
    return answers


def _offered(value: object) -> str | None:
    """The current value as the prompt offers it (None: nothing to offer)."""
    if value is None or value == []:
        return None
    if isinstance(value, list):
        return ", ".join(map(str, value))
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def ask(out: Console, question: Question, current: object) -> object:
    """Ask one question until its answer is accepted; return the value."""
    from rich.prompt import Confirm, Prompt

    while True:
        if question.kind == "bool":
            return Confirm.ask(question.label, default=bool(current), console=out)
        shown = _offered(current)
        if shown is None:
            text = Prompt.ask(question.label, console=out)
        else:
            text = Prompt.ask(question.label, default=shown, console=out)
        try:
            return interpret(question, text)
        except InvalidInputError as exc:
            out.print(f"[red]{escape(str(exc))}[/] Try again.")


def try_route(out: Console, config: Config, answers: Answers) -> bool:
    """Make one tiny call through the answered route and say how it went."""
    from fermix import llm
    from fermix.cli.doctor_checks.environment import TINY_PROMPT

    values: dict[str, Any] = {}
    for question in MODEL:
        value = answers[question.key]
        values[question.key.rsplit(".", 1)[1]] = tuple(value) if isinstance(value, list) else value
    route = llm.Route.from_config(dataclasses.replace(config.model, **values))
    try:
        with out.status(f"asking {route.primary} to say OK..."):
            answer = llm.complete(route, TINY_PROMPT, agent="setup", max_tokens=5)
    except FermixError as exc:
        out.print(f"[red]model test failed:[/] {escape(str(exc))}")
        return False
    reply = " ".join(answer.content.split())[:40]
    out.print(
        f"[green]model test passed:[/] {escape(answer.model)} answered {escape(repr(reply))}"
        f" in {answer.latency_ms:.0f} ms"
    )
    return True


def wizard(out: Console, config: Config, answers: Answers) -> Answers:
    """Ask every question, starting from ``answers``; return the new answers."""
    from rich.prompt import Confirm

    answers = dict(answers)
    out.print("[bold]fermix setup[/]: Enter keeps the value in (parentheses).")
    while True:
        out.print("\n[bold]Model route[/] (for the reviewer, compaction and chat)")
        for question in MODEL:
            answers[question.key] = ask(out, question, answers[question.key])
        env = answers[MODEL[3].key]
        if isinstance(env, str) and env not in os.environ:
            out.print(f"note: {env} is not set here; set it wherever fermix runs")
        if answers[PRIMARY.key] is None:
            break
        if not Confirm.ask(
            "Test the model route with one tiny call now?", default=True, console=out
        ):
            break
        if try_route(out, config, answers) or not Confirm.ask(
            "Change the model route?", default=True, console=out
        ):
            break
    out.print("\n[bold]Memory[/]")
    answers[INTERVAL.key] = ask(out, INTERVAL, answers[INTERVAL.key])
    answers[COMPACTION.key] = ask(out, COMPACTION, answers[COMPACTION.key])
    if answers[COMPACTION.key]:
        answers[THRESHOLD.key] = ask(out, THRESHOLD, answers[THRESHOLD.key])
    answers[VOICE.key] = ask(out, VOICE, answers[VOICE.key])
    return answers


def _same(key: str, a: object, b: object) -> bool:
    """Whether two TOML values mean the same for ``key`` (``24`` and ``24.0`` do)."""
    rule = KEYS[key].rule
    empty: tuple[object, ...] = (None, [], ())
    if a in empty or b in empty:
        return a in empty and b in empty
    return rule.convert(a) == rule.convert(b)


def update_document(document: TOMLDocument, answers: Answers) -> None:
    """Bring ``document`` to ``answers``, changing only the keys whose value changes."""
    in_file = document_values(document)
    for key, value in answers.items():
        default = KEYS[key].default
        if key in in_file:
            if value in (None, []):
                unset_document_value(document, key)
            elif not _same(key, in_file[key], value):
                set_document_value(document, key, value)
        elif not _same(key, default, value) and value is not None:
            set_document_value(document, key, value)


def render(path_exists: bool, document: TOMLDocument, answers: Answers) -> str:
    """The text config.toml will hold: an edit of the file, or a fresh commented template."""
    if path_exists:
        update_document(document, answers)
        return document.as_string()
    chosen = {
        key: value
        for key, value in answers.items()
        if value not in (None, []) and not _same(key, KEYS[key].default, value)
    }
    return defaults_toml(chosen)


def _flag_answers(args: argparse.Namespace, answers: Answers) -> Answers:
    """``answers`` with every given flag applied, each checked like a wizard answer."""
    given: dict[Question, str | None] = {
        PRIMARY: args.model,
        MODEL[1]: None if args.fallback is None else ",".join(args.fallback),
        MODEL[2]: args.api_base,
        MODEL[3]: args.api_key_env,
        INTERVAL: args.review_interval_hours,
        THRESHOLD: args.compaction_threshold,
    }
    answers = dict(answers)
    for question, text in given.items():
        if text is not None:
            answers[question.key] = interpret(question, text)
    for question, flag in ((COMPACTION, args.compaction), (VOICE, args.voice)):
        if flag is not None:
            answers[question.key] = flag
    return answers


def cmd_setup(ctx: CommandContext, args: argparse.Namespace) -> int:
    """``fermix setup``: ask (or read flags), show, confirm, write atomically."""
    out = console()
    path = ctx.home.config_path
    config = load_config(path)
    document = read_document(path)
    before = document.as_string()
    answers = starting_answers(config, document_values(document))
    if args.non_interactive:
        answers = _flag_answers(args, answers)
        if args.test_model and not try_route(out, config, answers):
            print("fermix: model test failed; config.toml was not written", file=sys.stderr)
            return 1
    elif not sys.stdin.isatty():
        raise InvalidInputError("fermix setup asks on a terminal; use --non-interactive and flags")
    else:
        try:
            answers = wizard(out, config, answers)
        except EOFError:
            out.print("\nsetup cancelled; nothing was written")
            return 1
    text = render(path.exists(), document, answers)
    if path.exists() and text == before:
        out.print(f"{path} already holds these values; nothing to write", markup=False)
        return 0
    result = parse_document(text)
    try:
        check_document(result, str(path))
    except ConfigError as exc:
        raise usage_error(exc) from None
    if not args.non_interactive and not _confirm(out, path, text):
        out.print("nothing was written")
        return 0
    write_document(path, result)
    out.print(f"wrote {path}", markup=False)
    return 0


def _confirm(out: Console, path: object, text: str) -> bool:
    """Show the file to be written, verbatim, and ask whether to write it."""
    from rich.prompt import Confirm

    out.rule(escape(f"{path} will hold"), characters="-")
    out.print(text.rstrip("\n"), markup=False, highlight=False, soft_wrap=True)
    out.rule(characters="-")
    try:
        return Confirm.ask(escape(f"Write {path}?"), default=True, console=out)
    except EOFError:
        return False
