"""Memory predicted before loading: a model's shape without its weights (``model_shapes.py``), the estimator
(``estimator.py``), will it fit and what to suggest (``fit.py``), the per-machine correction learned from what was
measured (``calibration.py``), and a model described before loading (``describe.py``, the wizard's first page)."""
