"""memtrace: Frida-driven memory tracers for iOS apps and daemons, and local Linux processes."""

__version__ = "0.1.0"
