"""Code run in other processes by the tests (imported by multiprocessing spawn children)."""

import numpy as np

import depot
from conftest import address_of, in_store, memory_kib


def read_shared_array(socket, ref):
    """In a spawned child: gets the array, and reports where it lies and what it cost."""
    anon_before = memory_kib("RssAnon")
    with depot.Client(socket) as client:
        array = client.get(ref)
        total = int(array.sum(dtype=np.int64))  # touches every byte
        return {
            "sum": total,
            "in_store": in_store(address_of(array), array.nbytes),
            "anon_growth_kib": memory_kib("RssAnon") - anon_before,
            "reply": client.put(array[:10] * 2),
        }
