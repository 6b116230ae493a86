"""The OpenAI-compatible server: the engine service behind ``/v1/models``, ``/v1/chat/completions`` and
``/v1/completions`` (FastAPI on uvicorn), with structured output enforced while decoding (llguidance).

``runner.ApiServer`` runs it on a thread of its own, for ``redline serve`` and the window's Server switch
alike; ``app.build_app`` is the ASGI application; ``config.ServerConfig`` what it may do.
"""
