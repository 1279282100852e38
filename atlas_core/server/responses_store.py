"""In-memory store of Responses API results, bounded and least-recently-used first out."""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass


@dataclass
class StoredResponse:
    """One stored response.

    Attributes:
        body: the response object as returned to the client (JSON-ready dict).
        messages: the whole conversation it ended, as template messages (its input, earlier
            turns through ``previous_response_id`` included, then its output); instructions
            are not part of it (they do not carry over to the next response).
    """

    body: dict
    messages: list[dict]


class ResponseStore:
    """At most ``capacity`` responses; reading one makes it the most recently used.

    Args:
        capacity: how many to keep; 0 keeps none.
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._items: OrderedDict[str, StoredResponse] = OrderedDict()
        self._lock = threading.Lock()

    def put(self, response_id: str, item: StoredResponse) -> None:
        """Store ``item``, dropping the least recently used beyond the capacity."""
        if self.capacity <= 0:
            return
        with self._lock:
            self._items[response_id] = item
            self._items.move_to_end(response_id)
            while len(self._items) > self.capacity:
                self._items.popitem(last=False)

    def get(self, response_id: str) -> StoredResponse | None:
        with self._lock:
            item = self._items.get(response_id)
            if item is not None:
                self._items.move_to_end(response_id)
            return item

    def delete(self, response_id: str) -> bool:
        with self._lock:
            return self._items.pop(response_id, None) is not None

    def __len__(self) -> int:
        return len(self._items)
