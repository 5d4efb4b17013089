"""broker/node/gc_tuning.py: what a started node does to the cyclic collector."""
from __future__ import annotations

import gc

from structlog.testing import capture_logs

from warren.broker.node import gc_tuning


def test_tuning_freezes_what_start_up_built_and_spaces_collections_out():
    thresholds = gc.get_threshold()
    callbacks = list(gc.callbacks)
    try:
        gc_tuning.tune_after_start()
        gc_tuning.tune_after_start()
        assert gc.get_freeze_count() > 0, "start-up objects should be in the permanent generation"
        assert gc.get_threshold() == (gc_tuning.YOUNG_THRESHOLD, gc_tuning.MIDDLE_THRESHOLD,
                                      gc_tuning.OLD_THRESHOLD), f"thresholds are {gc.get_threshold()}"
        assert gc_tuning.YOUNG_THRESHOLD > thresholds[0], "young collections should come less often than CPython's"
        watches = [c for c in gc.callbacks if isinstance(c, gc_tuning.PauseWatch)]
        assert len(watches) == 1, f"one pause watch expected however often it is called, got {len(watches)}"
    finally:
        gc.unfreeze()
        gc.set_threshold(*thresholds)
        gc.callbacks[:] = callbacks


def test_a_long_collection_is_logged_and_a_short_one_is_not(monkeypatch):
    watch = gc_tuning.PauseWatch()
    with capture_logs() as logs:
        watch("start", {"generation": 0})
        watch("stop", {"generation": 0, "collected": 0})
        monkeypatch.setattr(gc_tuning, "LONG_PAUSE_SECONDS", 0.0)
        watch("start", {"generation": 2})
        watch("stop", {"generation": 2, "collected": 7})
    assert [(e["event"], e["generation"], e["collected"]) for e in logs] == [("gc.long_pause", 2, 7)], logs
