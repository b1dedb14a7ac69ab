"""liveput: proactive, liveput-optimized DNN training on preemptible (spot) instances."""

from liveput.errors import LiveputError

__version__ = "0.1.0"

__all__ = ["LiveputError", "__version__"]
