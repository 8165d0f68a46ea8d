"""CLI, options and graph wiring of the DP-CDA release job."""
__version__ = "0.1.0"
