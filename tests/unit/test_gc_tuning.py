"""broker/gc_tuning.py: what a started node does to the cyclic collector."""
from __future__ import annotations

import gc

from broker import gc_tuning


def test_tuning_freezes_what_start_up_built_and_spaces_collections_out():
    thresholds = gc.get_threshold()
    try:
        gc_tuning.tune_after_start()
        assert gc.get_freeze_count() > 0, "start-up objects should be in the permanent generation"
        assert gc.get_threshold() == (gc_tuning.YOUNG_THRESHOLD, gc_tuning.MIDDLE_THRESHOLD,
                                      gc_tuning.OLD_THRESHOLD), f"thresholds are {gc.get_threshold()}"
        assert gc_tuning.YOUNG_THRESHOLD > thresholds[0], "young collections should come less often than CPython's"
    finally:
        gc.unfreeze()
        gc.set_threshold(*thresholds)
