"""``fermix hermes install``: fermix as Hermes Agent's memory provider (I1).

Writes ``$HERMES_HOME/plugins/fermix/`` (:mod:`fermix.integrations.hermes.install`) and
says how to select it. ``--hermes-home`` defaults to Hermes's own choice: ``$HERMES_HOME``,
else ``~/.hermes``. Running it again updates the plugin; a ``plugins/fermix`` it did not
write is refused (exit 1) unless ``--force`` replaces it. The fermix home (``--home``) is
not touched: the provider's settings say which one it opens.
"""

from __future__ import annotations

import argparse
import sys

from fermix.cli.context import CommandContext


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``hermes`` command group."""
    group = sub.add_parser("hermes", help="fermix as Hermes Agent's memory provider")
    cmds = group.add_subparsers(dest="hermes_command", required=True, metavar="COMMAND")
    p = cmds.add_parser("install", help="install the provider into $HERMES_HOME/plugins/fermix/")
    p.add_argument(
        "--hermes-home",
        metavar="DIR",
        default=None,
        help="Hermes's home (default: $HERMES_HOME, else ~/.hermes)",
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="replace a plugins/fermix folder that fermix did not write",
    )
    p.set_defaults(handler=cmd_install)


def cmd_install(ctx: CommandContext, args: argparse.Namespace) -> int:
    """``fermix hermes install``: write the plugin, then say how to select it."""
    from fermix.integrations.hermes import settings
    from fermix.integrations.hermes.install import install

    done = install(args.hermes_home, force=args.force)
    lines = []
    if done.replaced_foreign:
        lines.append(f"replaced {done.folder} (it was not fermix's)")
    state = "installed" if done.changed else "already installed, unchanged"
    lines += [
        f"fermix memory provider {state}: {done.folder}",
        "Select it in Hermes, in one of these ways:",
        "  hermes memory setup    (pick fermix: it asks for the provider's settings)",
        "  hermes config set memory.provider fermix",
        f"  or in {done.hermes_home / 'config.yaml'}:",
        "    memory:",
        "      provider: fermix",
        f"Its settings: {settings.path_in(done.hermes_home)} (none: embedded, on $FERMIX_HOME",
        f"or ~/.fermix); a memory server's token goes in ${settings.TOKEN_ENV}.",
        "fermix must be installed in the Python environment Hermes runs in.",
    ]
    # Plain lines, not rich: a path may hold brackets, and the YAML must not be re-wrapped.
    sys.stdout.write("\n".join(lines) + "\n")
    return 0
