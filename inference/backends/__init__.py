"""What the engine's target is: the interface (``base.py``: ``Backend``, ``Capabilities``), a model loaded here
(``local.py``) and a model behind another OpenAI-compatible server (``remote.py``)."""
