"""Free page reporting, a source of noise in any round that writes new memory on a VM.

A guest whose balloon device offers free page reporting (virtio_balloon's VIRTIO_BALLOON_F_REPORTING;
the kernel's mm/page_reporting.c) hands blocks of free pages of order >= page_reporting_order (2 MiB at
order 9) back to the host a few seconds after they are freed; the next touch of such a page faults in
the host, which shows in the guest as a slow instruction. This machine's balloon reports
(/sys/module/page_reporting/parameters/reported_kib grows by tens of MiB per conversion round).

Measured here with bench/convert.py's own rounds (megatron->hf, base100m, warm input): with reporting
on, the side of a pair that drew reported pages for its page-cache writes spent 3x longer in the
kernel's copy into page cache (perf: copy_folio_from_iter_atomic 494 samples against 151) and 0.22-0.54 s
of CPU instead of 0.11 s; which side drew them changed from run to run (the floor in one run, the
conversion in the next), so a median of 5 could be either side's slow rounds. With reporting held off,
ten rounds alternating: conversion 0.21-0.22 s, floor 0.11-0.14 s.

reporting_held_off() raises page_reporting_order past the largest block order for the rounds of a
measurement (nothing is reported; pages freed stay with the guest), where this process may write it
(root), and puts the old value back after. A process killed inside leaves it raised, which costs only
the memory the host did not get back. It yields one line saying what it did, for the output."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

REPORTING_ORDER = Path("/sys/module/page_reporting/parameters/page_reporting_order")
HELD_OFF = "11"  # past x86-64's largest buddy order (MAX_PAGE_ORDER 10): no free block qualifies


@contextlib.contextmanager
def reporting_held_off(setting: Path = REPORTING_ORDER) -> Iterator[str]:
    """Hold the guest's free page reporting off inside the block where it can; yields what it did."""
    try:
        before = setting.read_text().strip()
    except OSError:
        yield "free page reporting: not offered by this kernel (no host faults from it)"
        return
    if before == HELD_OFF:  # another measurement holds it off: leave it to that one to put back
        yield "free page reporting: already held off"
        return
    try:
        setting.write_text(HELD_OFF)
    except OSError as err:
        yield (f"free page reporting: ON (order {before}; {setting} not writable: {err.strerror}): rounds may "
               "include host faults on reported memory, see bench/host_memory.py")
        return
    try:
        yield f"free page reporting: held off for the rounds (order {before} -> {HELD_OFF}, put back after)"
    finally:
        with contextlib.suppress(OSError):
            if setting.read_text().strip() == HELD_OFF:
                setting.write_text(before)
