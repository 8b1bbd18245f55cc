"""One symbolization service for every tracer, the console, JSON and the report.

Addresses are resolved on the host from the modules' files and their separate debug files
(ELF build-id / .gnu_debuglink, Mach-O dSYMs): function names, file:line and inlined calls
through Sentry's symbolic.  Rows keep names as the binaries spell them; readers demangle them
(C++, Swift, Rust) through pydemumble.  Local targets use it at capture time; ``memtrace
symbolize`` re-runs it over any capture later.
"""

from memtrace.symbols.demangle import demangle, looks_mangled
from memtrace.symbols.locate import ModuleRef, Source
from memtrace.symbols.service import HostSymbolizer, Symbolizer

__all__ = ["HostSymbolizer", "ModuleRef", "Source", "Symbolizer", "demangle", "looks_mangled"]
