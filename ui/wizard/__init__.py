"""The model configuration wizard: the wizard itself (``wizard``), one module per page, and what the pages share.

Pages, in order: ``model_page``, ``hardware_page``, ``config_page``, ``draft_page``, ``load_page``,
``preset_page``. Shared: ``model_picker`` (choosing a model, and checking the choice), ``tips`` (the
tooltips) and ``labels`` (verdict colours, label helpers).

Pages never wait on the engine: anything that imports torch or reads tokenizers (describing a
model, probing the hardware, comparing a draft's tokenizer, loading) is an engine-thread task
awaited in an ``asyncSlot``; a page is "complete" only once its answer is in. The estimates
themselves are arithmetic on the model's shape, so the table recomputes live on the UI thread.
"""

from .wizard import ConfigWizard

__all__ = ["ConfigWizard"]
