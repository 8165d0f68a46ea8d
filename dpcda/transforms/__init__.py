"""One PTransform per stage (Beam modules), plus their Beam-free cores (``shards``, ``combiners``,
``mixing``), which the GPU machine and the evaluation import without Beam."""
