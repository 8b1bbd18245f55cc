"""The command-line layer: parses options and calls the library; nothing else."""

from __future__ import annotations

import importlib
import sys

import click

from memtrace import __version__
from memtrace.capture import CaptureError
from memtrace.errors import MemtraceError

# One module per subcommand in memtrace.commands, each exposing ``command``.
COMMANDS = (
    "malloc", "iosurface", "purgeable", "probe", "fds", "threads",
    "census", "limit", "jetsam", "report", "batch", "export", "symbolize",
)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="memtrace")
def cli() -> None:
    """Trace how much memory a process allocates, what it allocates, and when it makes memory discardable."""


for _name in COMMANDS:
    try:
        _module = importlib.import_module(f"memtrace.commands.{_name}")
    except ModuleNotFoundError as _e:
        if _e.name != f"memtrace.commands.{_name}":
            raise
        continue
    cli.add_command(_module.command)


def main(argv: list[str] | None = None) -> None:
    try:
        rc = cli.main(args=argv, prog_name="memtrace", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("memtrace: interrupted", err=True)
        sys.exit(130)
    except click.ClickException as e:
        e.show()
        sys.exit(e.exit_code)
    except (MemtraceError, CaptureError) as e:
        click.echo(f"memtrace: error: {e}", err=True)
        sys.exit(getattr(e, "exit_code", 2))
    except BrokenPipeError:
        sys.exit(1)
    except KeyboardInterrupt:
        click.echo("memtrace: interrupted", err=True)
        sys.exit(130)
    sys.exit(rc if isinstance(rc, int) else 0)


if __name__ == "__main__":
    main()
