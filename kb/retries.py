"""The retry budget of the owner's specification (4.4, 11.3): at most 3
retries, after 60, 120 and 240 s, and a count of used retries per source
that is never reset. No Dagster here.

One rule for each kind of work:
- A step of a run (parse, wiki change, lint, synthesis): the asset asks
  Dagster for a step retry (dg.RetryRequested) with `wait_after(used)`, where
  `used` is the persisted count (kb_assets/retry_budget.py). Dagster's
  RetryPolicy cannot give these waits: its exponential backoff is
  delay * (2^n - 1), that is 60, 180 and 420 s.
- A wait inside one step (the quality gate's tries): `retrying()`, a
  tenacity loop with the same waits.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

# The specification's waits: their number is the number of retries.
SPEC_WAITS_S = (60, 120, 240)


@dataclass(frozen=True)
class RetryBudget:
    """The waits before each retry; their number is the number of retries."""

    waits_s: tuple[float, ...] = SPEC_WAITS_S

    @classmethod
    def doubling(cls, first_s: float, retries: int) -> RetryBudget:
        """`retries` waits that start at `first_s` and double: 60, 120, 240."""
        return cls(tuple(first_s * 2 ** n for n in range(retries)))

    @property
    def retries(self) -> int:
        return len(self.waits_s)

    @property
    def tries(self) -> int:
        return self.retries + 1

    def left(self, used: int) -> int:
        """The retries that are left after `used` of them."""
        return max(0, self.retries - used)

    def wait_after(self, used: int) -> float | None:
        """The wait before the next retry, after `used` retries; None when
        none is left."""
        return self.waits_s[used] if 0 <= used < self.retries else None

    def retrying(self, retry_on: Sequence[type[BaseException]], on_retry: Callable[[int, BaseException, float], None]
                 | None = None, sleep: Callable[[float], None] | None = None):
        """A tenacity loop: at most `tries` tries of the errors `retry_on`,
        with the budget's waits between them. `on_retry(try, error, wait)` is
        called before each wait. After the last try, tenacity raises
        RetryError (reraise=False), so that the caller decides what a spent
        budget means (the gate accepts the source)."""
        import tenacity  # here: the modules that import this one do not all need it

        waits = self.waits_s

        def wait(state: tenacity.RetryCallState) -> float:
            # tenacity asks for the wait before it asks the stop: after the last try there is none.
            n = state.attempt_number - 1
            return float(waits[n]) if n < len(waits) else 0.0

        def before_sleep(state: tenacity.RetryCallState) -> None:
            if on_retry is not None:
                on_retry(state.attempt_number, state.outcome.exception(), state.next_action.sleep)

        options = {"sleep": sleep} if sleep is not None else {}
        return tenacity.Retrying(retry=tenacity.retry_if_exception_type(tuple(retry_on)),
                                 stop=tenacity.stop_after_attempt(self.tries), wait=wait,
                                 before_sleep=before_sleep, reraise=False, **options)
