"""What a FUSE server says a start cost it: requests by kind (misses of LOOKUP apart) and
the CPU answering each kind, summed over its reader threads."""

from __future__ import annotations

import threading

from bootseer.fuse import proto as p
from bootseer.fuse.server import NEGATIVE_LOOKUP, RequestCounts


def test_requests_and_their_cpu_are_summed_over_threads_by_kind() -> None:
    requests = RequestCounts()

    def answer(lookups: int, misses: int) -> None:
        counts, cpu = requests.for_thread()
        for kind, n, ns in ((p.LOOKUP, lookups, 1000), (NEGATIVE_LOOKUP, misses, 500),
                            (p.READ, 1, 2_000_000), (999, 1, 1)):
            counts[kind] = counts.get(kind, 0) + n
            cpu[kind] = cpu.get(kind, 0) + n * ns

    threads = [threading.Thread(target=answer, args=(3, 2)) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert requests.snapshot() == {"lookup": 12, "lookup_negative": 8, "op999": 4,
                                   "read": 4, "total": 28}
    cpu = requests.cpu_seconds()
    assert cpu["read"] == 0.008 and cpu["lookup"] == 12e-6 and cpu["lookup_negative"] == 4e-6
    assert cpu["total"] == round(0.008 + 12e-6 + 4e-6 + 4e-9, 6)
