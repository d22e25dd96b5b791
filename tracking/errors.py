"""MLflow's error shape: {"error_code": "...", "message": "..."} with its HTTP statuses (MLflow's
databricks_pb2 error codes and mlflow.server.handlers' mapping)."""
from __future__ import annotations

STATUS = {
    "INVALID_PARAMETER_VALUE": 400,
    "BAD_REQUEST": 400,
    "MALFORMED_REQUEST": 400,
    "RESOURCE_ALREADY_EXISTS": 400,
    "INVALID_STATE": 400,
    "UNAUTHENTICATED": 401,
    "PERMISSION_DENIED": 403,
    "RESOURCE_DOES_NOT_EXIST": 404,
    "ENDPOINT_NOT_FOUND": 404,
    "REQUEST_LIMIT_EXCEEDED": 429,
    "NOT_IMPLEMENTED": 501,
}


class MlflowError(Exception):
    def __init__(self, message: str, error_code: str = "INVALID_PARAMETER_VALUE", *, status: int | None = None):
        super().__init__(message)
        self.message = message
        self.error_code = error_code
        self.status = status or STATUS.get(error_code, 400)

    def body(self) -> dict:
        return {"error_code": self.error_code, "message": self.message}


def invalid(message: str) -> MlflowError:
    return MlflowError(message, "INVALID_PARAMETER_VALUE")


def not_found(message: str) -> MlflowError:
    return MlflowError(message, "RESOURCE_DOES_NOT_EXIST")


def denied(message: str) -> MlflowError:
    return MlflowError(message, "PERMISSION_DENIED")
