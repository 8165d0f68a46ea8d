"""Cross-checks: our figures against another implementation's, and properties held to what they must be (the exit
status of a refused run, training precision, the accountant's round-off)."""
