"""Capped exponential backoff with full jitter.

Thousands of node controllers hit one API server; when it comes back after an
outage, jitter spreads their retries instead of letting them arrive in waves.
"""

import random
from dataclasses import dataclass, field


@dataclass(slots=True)
class Backoff:
    """Delays of ``uniform(0, min(cap, base * 2**failures))``; ``reset()`` after a success."""

    base: float = 0.5
    cap: float = 60.0
    rng: random.Random = field(default_factory=random.Random)
    failures: int = 0

    def next_delay(self) -> float:
        """The delay before the next attempt; counts one more failure."""
        ceiling = min(self.cap, self.base * float(2 ** min(self.failures, 62)))
        self.failures += 1
        # Never zero: a retry loop against a dead server must yield to the event loop.
        jittered: float = ceiling * self.rng.random()
        return max(jittered, min(ceiling, 0.001))

    def reset(self) -> None:
        self.failures = 0
