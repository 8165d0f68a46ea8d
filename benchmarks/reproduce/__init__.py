"""The result tables of docs/results.md and docs/reproduction.md: the papers' tables beside ours."""
