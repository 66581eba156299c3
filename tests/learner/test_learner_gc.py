"""The learner worker moves what start-up leaves alive out of the cyclic collector's reach
(``learner.worker.freeze_long_lived_objects``), and what a step allocates later is still collected."""

from __future__ import annotations

import gc
import inspect
import weakref

from hacrl_core.learner import worker


class _Node:
    def __init__(self) -> None:
        self.me = self  # a reference cycle: only the cyclic collector frees it


def test_freezing_moves_live_objects_out_of_the_collector_and_later_cycles_are_still_freed() -> None:
    before = gc.get_freeze_count()
    kept = _Node()
    try:
        worker.freeze_long_lived_objects()
        assert gc.get_freeze_count() > before
        assert not any(obj is kept for obj in gc.get_objects())  # frozen: no generation holds it
        later = _Node()
        alive = weakref.ref(later)
        del later
        gc.collect()
        assert alive() is None  # a cycle made after the freeze is collected
    finally:
        gc.unfreeze()


def test_the_worker_freezes_after_start_up_and_after_its_first_step() -> None:
    source = inspect.getsource(worker.run_learner_worker)
    assert source.count("freeze_long_lived_objects()") == 2
    assert source.index("start_learner(") < source.index("freeze_long_lived_objects()")
