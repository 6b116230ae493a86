"""Memory, three ways: what is measured, how the process holds it, and what the estimator predicts before loading."""
