"""The command-line layer: parses options and calls the library; nothing else.

Tracer commands are made from the tracer registry (memtrace.tracers); the other commands are
one module each in memtrace.commands, exposing ``command``.
"""

from __future__ import annotations

import contextlib
import errno
import importlib
import os
import sys

import click

from memtrace import __version__, tracers
from memtrace.capture import CaptureError
from memtrace.commands.trace import make_command
from memtrace.errors import MemtraceError, first_line, is_frida_error

COMMANDS = ("doctor", "census", "limit", "jetsam", "report", "batch", "export", "symbolize", "show", "diff",
            "flamegraph")


class _Commands(click.Group):
    """The tracer commands (made from the registry) and the others (COMMANDS, imported), each
    when asked for: a capture's start does not pay for the report, export and census machinery,
    nor for the other tracers' commands (issue 21: fixed cost)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return [*sorted(tracers.names()), *(n for n in COMMANDS if n not in tracers.names())]

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands:
            tracer = tracers.get(cmd_name)
            if tracer is not None:
                self.add_command(make_command(tracer))
            elif cmd_name in COMMANDS:
                self.add_command(importlib.import_module(f"memtrace.commands.{cmd_name}").command)
        return super().get_command(ctx, cmd_name)


@click.group(cls=_Commands, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="memtrace")
def cli() -> None:
    """Trace how much memory a process allocates, what it allocates, and when it makes memory discardable."""


def main(argv: list[str] | None = None) -> None:
    try:
        rc = cli.main(args=argv, prog_name="memtrace", standalone_mode=False)
        sys.stdout.flush()          # a full standard output fails here, not at exit (issue 27)
    except click.exceptions.Abort:
        click.echo("memtrace: interrupted", err=True)
        sys.exit(130)
    except click.UsageError as e:
        # One line, like every other error: what is wrong and with which option.
        hint = f" (see memtrace {e.ctx.info_name} --help)" if e.ctx is not None and e.ctx.info_name != "memtrace" else ""
        click.echo(f"memtrace: error: {inert(e.format_message())}{hint}", err=True)
        sys.exit(e.exit_code)
    except click.ClickException as e:
        click.echo(f"memtrace: error: {inert(e.format_message())}", err=True)
        sys.exit(e.exit_code)
    except (MemtraceError, CaptureError) as e:
        # Messages quote file names and target data: control characters are shown, not obeyed.
        click.echo(f"memtrace: error: {inert(e)}", err=True)
        sys.exit(getattr(e, "exit_code", 2))
    except BrokenPipeError:
        _drop_stdout()
        sys.exit(1)
    except OSError as e:
        # Every file a user names is written through memtrace.files (its failures are one
        # InputError line): an OSError that reaches here is standard output's -- a full disk
        # behind a redirection, /dev/full.  What was written stays; the status says it is short.
        if e.errno not in _OUTPUT_ERRNOS:
            raise
        _drop_stdout()
        click.echo(f"memtrace: error: standard output: cannot write: {e.strerror}", err=True)
        sys.exit(1)
    except Exception as e:
        # The last net for Frida: each place that calls it maps the errors it expects with
        # context; any other Frida error is still one line, not a traceback.
        if not is_frida_error(e):
            raise
        click.echo(f"memtrace: error: frida: {inert(first_line(e))}", err=True)
        sys.exit(2)
    except KeyboardInterrupt:
        click.echo("memtrace: interrupted", err=True)
        sys.exit(130)
    sys.exit(rc if isinstance(rc, int) else 0)


_OUTPUT_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO, errno.EPIPE})


def _drop_stdout() -> None:
    """Point standard output at /dev/null, so what is still buffered is not written (and failed)
    again at exit."""
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)


def inert(value: object) -> str:
    """An error line: control characters shown, and a newline in quoted data cannot start another."""
    # rich: imported on an error, not before every capture starts
    from memtrace.reporters.console import inert as _inert

    return _inert(value).replace("\n", "\\n")


if __name__ == "__main__":
    main()
