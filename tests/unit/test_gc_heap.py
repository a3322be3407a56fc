"""utils/gc_heap.py: the start-up heap leaves the generations that collections walk."""

import gc

from lean_rl.utils.gc_heap import freeze_startup_heap


def test_objects_alive_at_freeze_leave_the_collected_generations():
    alive_at_start_up = [[i] for i in range(3)]  # containers of containers: tracked by the collector
    assert gc.is_tracked(alive_at_start_up) and any(obj is alive_at_start_up for obj in gc.get_objects())
    try:
        frozen = freeze_startup_heap()
        assert frozen > 0 and gc.get_freeze_count() >= frozen  # (CI saw the count grow by 2 after it returned)
        walked = gc.get_objects(generation=2) + gc.get_objects(generation=1) + gc.get_objects(generation=0)
        assert not any(obj is alive_at_start_up for obj in walked)
        made_after = [[]]
        assert any(obj is made_after for obj in gc.get_objects())  # generations 0-2: collected as usual
    finally:
        gc.unfreeze()  # the rest of the test session collects as usual
