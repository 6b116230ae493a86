"""The OpenAI-compatible server: the engine service behind ``/v1/models``, ``/v1/chat/completions`` and
``/v1/completions`` (FastAPI on uvicorn), with structured output enforced while decoding (llguidance).

``lifetime.ApiServer`` runs it on a thread of its own, for ``redline serve`` and the window's Server switch
alike; ``routes.build_app`` is the ASGI application and its endpoints; ``preparation`` turns a request body into a
prepared ``GenerationRequest``; ``streaming`` writes the answers (server-sent events or one JSON object);
``protocol`` holds the request bodies and the error object; ``tokenizers`` the server's copy of the tokenizer;
``structured`` the grammars; ``stats`` what the window shows; ``middleware`` the body limit; ``config.ServerConfig``
what it may do.
"""
