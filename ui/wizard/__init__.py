"""The model configuration wizard: the wizard itself and its pages."""

from redline.ui.wizard.wizard import ConfigWizard

__all__ = ["ConfigWizard"]
