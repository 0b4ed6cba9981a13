"""The client side of mTLS: a client certificate, its key and the CA bundle that servers are verified against,
kept fresh for httpx, requests, aiohttp and gRPC channels (:mod:`tlsreload_plugins.client.identity` and one glue
module per client library)."""

from tlsreload_plugins.client.identity import ClientIdentity, OwnContext, Presented, client_context

__all__ = ["ClientIdentity", "OwnContext", "Presented", "client_context"]
