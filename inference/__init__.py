"""Redline's engine: model sources, loading, decoding, metrics. Free of Qt by contract."""
