"""The DP domain step of a table release, Beam-free: what it derives (``request``, before any row is read), its
public grids (``grid``), the exact summaries as combiner cores (``summaries``), and the measurements and what is read
off them, down to a complete ``schemas.table.TableSchema`` (``derive``). Accounting: ``privacy.domain``."""
