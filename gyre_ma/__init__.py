"""gyre-ma: online RL for ultra-long-horizon multi-agent tasks."""

__version__ = "0.1.0"
