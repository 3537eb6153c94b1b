"""The drop-in gateway: unmodified agents get the policy by pointing their base URL here.

:func:`create_gateway` is the ASGI app ``kilo-rules gateway`` serves (docs/gateway.md).
"""

from kilo_rules.tools.serving.gateway.app import GATEWAY_HEADER, create_gateway
from kilo_rules.tools.serving.gateway.ledger import Entry, LedgerError, SqliteLedger
from kilo_rules.tools.serving.gateway.protocols import PROTOCOLS, Protocol, Usage
from kilo_rules.tools.serving.gateway.settings import GatewaySettings

__all__ = [
    "GATEWAY_HEADER",
    "PROTOCOLS",
    "Entry",
    "GatewaySettings",
    "LedgerError",
    "Protocol",
    "SqliteLedger",
    "Usage",
    "create_gateway",
]
