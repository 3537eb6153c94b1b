"""kilo-rules: context policies as code."""

__version__ = "0.1.0"
