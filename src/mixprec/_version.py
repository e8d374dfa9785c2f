"""The version of mixprec, written into the files and pages it makes."""

__version__ = "0.1.0"
