"""Identities that do not start as files: pushed in memory (:mod:`.pushed`) or streamed by SPIFFE's Workload API
(:mod:`.spiffe`, its protocol in :mod:`.workload_api`). Both are written as files the core already watches."""

from tlsreload_plugins.sources.pushed import PushedIdentity

__all__ = ["PushedIdentity"]
