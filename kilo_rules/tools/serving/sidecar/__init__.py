"""The HTTP sidecar: ``kilo-rules serve`` and :func:`create_app`.

An agent written in any language posts its session and gets back the exact request to
send, built under the policy revision the sidecar serves (docs/serve.md). This package
needs the ``serve`` extra (``pip install 'kilo-rules[serve]'``): FastAPI, uvicorn and
prometheus-client are imported here and nowhere else in kilo_rules.
"""

from __future__ import annotations

from kilo_rules.tools.serving.sidecar.app import (
    DEFAULT_BUILD_TIMEOUT,
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_CONCURRENT_BUILDS,
    create_app,
    openapi_document,
)

__all__ = [
    "DEFAULT_BUILD_TIMEOUT",
    "DEFAULT_MAX_BODY_BYTES",
    "DEFAULT_MAX_CONCURRENT_BUILDS",
    "create_app",
    "openapi_document",
]
