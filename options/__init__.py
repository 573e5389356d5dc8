"""Options, the option library, and the task graph of milestones they achieve."""

from gyre_ma.options.graph import Milestone, TaskGraph
from gyre_ma.options.library import OptionLibrary, reference, resolve
from gyre_ma.options.option import CANNOT_PROCEED, Behaviour, Option, OptionContext, SubPolicy, Termination

__all__ = [
    "Behaviour", "CANNOT_PROCEED", "Milestone", "Option", "OptionContext", "OptionLibrary", "SubPolicy", "TaskGraph",
    "Termination", "reference", "resolve",
]
