from __future__ import annotations


class ServiceError(Exception):
    """A refused state change. The message says what to fix; views turn it into a 4xx or a form error."""

    status = 422

    def __init__(self, message: str, code: str, *, fields: dict | None = None, status: int | None = None):
        super().__init__(message)
        self.message = message
        self.code = code
        self.fields = fields or {}
        if status is not None:
            self.status = status


class Conflict(ServiceError):
    status = 409


class Forbidden(ServiceError):
    status = 403
