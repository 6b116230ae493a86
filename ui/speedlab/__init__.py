"""The speed lab's panel (``panel.SpeedLabPanel``), its configuration table (``configs``), its outputs side by side
(``outputs``) and the window's gauges following a run (``link.follow_speed_lab``)."""

from .panel import SpeedLabPanel

__all__ = ["SpeedLabPanel"]
