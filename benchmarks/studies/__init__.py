"""One-question studies: each measures why a default or a result is what it is; the answer is written in docs/."""
