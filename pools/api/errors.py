"""One error shape for the whole API: 400 with field errors, 409 with a reason code."""

from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import IntegrityError
from rest_framework import status
from rest_framework.exceptions import ValidationError
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from pools.statemachine import TransitionRefused


def exception_handler(exc, context):
    if isinstance(exc, TransitionRefused):
        return Response({"code": exc.code, "detail": exc.message}, status=status.HTTP_409_CONFLICT)
    if isinstance(exc, DjangoValidationError):
        detail = exc.message_dict if hasattr(exc, "error_dict") else {"detail": exc.messages}
        exc = ValidationError(detail)
    if isinstance(exc, IntegrityError):
        return Response(
            {"code": "conflict", "detail": "The request conflicts with existing data."},
            status=status.HTTP_409_CONFLICT,
        )
    return drf_exception_handler(exc, context)
