"""Users' action histories: a store built from a log, read by position, appended durably."""
from helmgr.history.store import HistoryStore, build

__all__ = ["HistoryStore", "build"]
