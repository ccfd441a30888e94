"""The package version, in the base layer: the report (which may not import the package root)
writes it into every JSON it saves."""

__version__ = "0.1.0"
