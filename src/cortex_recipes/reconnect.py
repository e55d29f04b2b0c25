"""Which failures a long run survives by reconnecting and resuming from its last checkpoint.

Recoverable: the backend went away or is restarting (connection refused or reset, timeouts,
409, 429, 5xx once the SDK's own retries are spent, a local backend whose process died). Not recoverable: a 404 -- the endpoint
no longer knows the job or the request, and on a hosted endpoint the first job may still run,
so starting a second one would train twice -- and everything else: a 400 naming a bad field,
a failed request, a check of ours. Those stop the run.
"""

from __future__ import annotations

import requests

from cortex_recipes.endpoint import BackendDied

RECOVERABLE_STATUSES = frozenset({409, 429, 500, 502, 503, 504})


def is_recoverable(exc: BaseException) -> bool:
    seen = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(
            current,
            requests.exceptions.ConnectionError
            | requests.exceptions.Timeout
            | TimeoutError
            | BackendDied,
        ):
            return True
        if isinstance(current, requests.exceptions.HTTPError):
            response = current.response
            return response is not None and response.status_code in RECOVERABLE_STATUSES
        current = current.__cause__ or current.__context__
    return False
