"""Run one ephemeral Modal app for one batch of work, and make sure it ends.

The caption and transcription resources both use `run_on_modal`:
1. `with app.run():` starts the app; it stops when the block ends, so no
   GPU is paid for between runs.
2. `.map(..., return_exceptions=True)` sends every input. The generator is
   read to its end: a loop that stops early (on the first error, or with
   zip() over a shorter list) leaves the map unfinished, and the results of
   the other inputs are lost.
3. A start-up error comes back as the result of every call (see
   modal_apps/caption_app.py). It is raised once, after the map, with its
   own message: the items wait for the next run and are not marked failed.
4. After the app stops, Modal is asked how many containers of the function
   still run. A container that is left costs money with no work to do, so
   that is an error that names the app.
"""

import logging
import time
from collections.abc import Callable, Iterable, Iterator

log = logging.getLogger(__name__)

CONTAINER_WAIT_S = 60.0
CONTAINER_POLL_S = 2.0


class ModalRunError(RuntimeError):
    """The Modal app did not start, some calls failed, or a container was left."""


def modal_ready() -> tuple[bool, str]:
    """(ready, detail): a Modal token is configured (MODAL_TOKEN_ID and
    MODAL_TOKEN_SECRET, or ~/.modal.toml from `modal token new`)."""
    try:
        from modal.config import config
    except ImportError:
        return False, "the modal package is not installed (pip install 'kb[modal]')"
    if config.get("token_id") and config.get("token_secret"):
        return True, "Modal token set"
    return False, "no Modal token: run `modal token new` or set MODAL_TOKEN_ID and MODAL_TOKEN_SECRET"


def mapped_results(outputs: Iterable, inputs: list, *, startup_marker: str) -> Iterator[tuple[object, object]]:
    """(input, output) for each call that worked, in input order.

    Reads `outputs` to its end whatever happens. Then raises ModalRunError
    for a start-up error or for failed calls."""
    startup_error: str | None = None
    failures: list[str] = []
    count = 0
    for count, output in enumerate(outputs, start=1):
        item = inputs[count - 1]
        if isinstance(output, BaseException):
            message = str(output)
            if startup_marker in message:
                startup_error = startup_error or message
            else:
                failures.append(f"{type(output).__name__}: {message}"[:500])
            continue
        yield item, output
    if count != len(inputs):
        failures.append(f"Modal gave {count} results for {len(inputs)} inputs")
    if startup_error:
        raise ModalRunError(f"{startup_error}. Nothing was marked failed: the items wait for the next run.")
    if failures:
        raise ModalRunError(f"{len(failures)} of {len(inputs)} Modal calls failed. First: {failures[0]}")


def wait_for_zero(read_count: Callable[[], int], *, wait_s: float, poll_s: float) -> int:
    """Poll `read_count` until it is 0 or `wait_s` is over; the last count."""
    deadline = time.monotonic() + wait_s
    while True:
        count = read_count()
        if count == 0 or time.monotonic() >= deadline:
            return count
        time.sleep(poll_s)


def containers_left(function_id: str, *, wait_s: float = CONTAINER_WAIT_S, poll_s: float = CONTAINER_POLL_S) -> int:
    """How many containers of the function still run, after a short wait
    for the ones that are stopping."""
    import modal
    from modal.exception import NotFoundError

    function = modal.Function.from_id(function_id)

    def running() -> int:
        try:
            return function.get_current_stats().num_total_runners
        except NotFoundError:
            return 0  # Modal forgot the stopped app, and its containers with it

    return wait_for_zero(running, wait_s=wait_s, poll_s=poll_s)


def run_on_modal(app, function, inputs: list, *, kwargs: dict, startup_marker: str, options: dict | None = None,
                 count_containers: Callable[[str], int] = containers_left) -> Iterator[tuple[object, object]]:
    """(input, output) for each input, from one ephemeral run of `app`.
    `options`: the GPU type and the container cap of this run (Modal's
    public Function.with_options()). Why arguments and not the definition:
    Modal fixes the decorator's values at import, and a second value in one
    process (a test, a changed .env after a Reload) was ignored.
    `count_containers(function_id)` asks Modal how many containers are left."""
    function_id: str | None = None
    run_error: ModalRunError | None = None
    finished = False
    try:
        with app.run():
            if options:
                # A variant of the function with its own container pool; its id is known once it is hydrated.
                function = function.with_options(**options).hydrate()
            function_id = function.object_id
            outputs = function.map(inputs, kwargs=kwargs, return_exceptions=True, wrap_returned_exceptions=False)
            try:
                yield from mapped_results(outputs, inputs, startup_marker=startup_marker)
            except ModalRunError as exc:
                run_error = exc
        finished = True
    finally:
        # Also when the caller stopped early: the app has stopped by now.
        left = count_containers(function_id) if function_id else 0
        if left:
            message = (f"{left} container(s) of Modal app {app.app_id} still run after the app stopped. "
                       f"Stop them: `modal app stop {app.app_id}`.")
            if finished:
                raise ModalRunError(message)
            log.error(message)
    if run_error:
        raise run_error
