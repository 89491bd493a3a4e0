"""blockx_cli."""

# The package's version as ``blockx --version`` prints it, without reading the
# installed metadata at start-up (a test keeps it equal to pyproject's version).
__version__ = "0.1.0"
