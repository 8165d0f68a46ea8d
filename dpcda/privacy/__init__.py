"""Privacy accounting, calibration, DP statistics and noise for DP-CDA.

Imports numpy, torch (noise only) and dp_accounting; never Beam. Each module states the
neighbouring relation it assumes.
"""
