"""The backend choice that the model clients share (Captioner, Transcriber).

Each of them runs its model on one of a few backends: `off`, `modal` and
one that runs here or at an endpoint. The choice is the client's `backend`
field (from a setting, for example KB_CAPTION_BACKEND). A Modal backend is
ready only when Modal has a token.
"""

from typing import ClassVar

from pydantic import BaseModel


class ModelBackendClient(BaseModel):
    """A model resource with a backend choice. A subclass sets BACKEND_SETTING
    (the settings field; its env var is the same name in capitals) and
    BACKENDS, and says in `ready_detail` where the model runs."""

    BACKEND_SETTING: ClassVar[str]
    BACKENDS: ClassVar[tuple[str, ...]]

    backend: str = "off"

    def backend_name(self) -> str:
        name = (self.backend or "off").strip().lower()
        if name not in self.BACKENDS:
            raise ValueError(f"{self.BACKEND_SETTING.upper()}={name!r} is not one of {', '.join(self.BACKENDS)}")
        return name

    def off_reason(self) -> str | None:
        """Why the model is off, or None when it is on."""
        backend = self.backend_name()
        if backend == "off":
            return f"{self.BACKEND_SETTING.upper()} is off"
        if backend == "modal":
            from kb.enrich.modal_runner import modal_ready

            ready, detail = modal_ready()
            return None if ready else detail
        return None

    def ready_detail(self) -> str:
        """Where the model runs, when it is on."""
        raise NotImplementedError

    def readiness(self) -> tuple[bool, str]:
        """(ready, detail) for `kb status`."""
        reason = self.off_reason()
        if reason:
            return False, reason
        return True, self.ready_detail()
