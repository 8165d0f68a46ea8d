"""EvaluateUtility: seed 000's Table 1 CNN trained on synthetic rows, tested on real rows.

``models`` (networks), ``train`` (``train_and_score``: the network alone, the linear probe alone and the recipe's
model, each named), over ``recipes``, ``targets``, ``stacking`` and ``loop``; ``report`` (report.json and PNGs),
``stage`` (``evaluate_release``), ``standalone`` (``evaluate_standalone``). Nothing here imports Apache Beam;
submodules are imported on use so that ``import dpcda.evaluation.train`` pulls in torch only.
"""
