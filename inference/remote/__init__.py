"""Remote engines: models behind OpenAI-compatible servers, used like local ones (``client.py``), and the
threads their replies run on, several at once (``runs.py``)."""
