"""Thin entry points. Each turns arguments into a library call, and a StuneError into one line and an exit
code. Nothing else in stune prints errors or calls sys.exit."""
