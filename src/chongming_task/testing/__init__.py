"""Helpers for testing code built on chongming-task, and for proving a custom store.

Nothing here imports pytest.
"""

from __future__ import annotations

from .clock import FakeClock as FakeClock
from .contract_base import ContractTimeout as ContractTimeout
from .faults import FaultyStore as FaultyStore
from .store_contract import StoreContract as StoreContract

__all__ = ["ContractTimeout", "FakeClock", "FaultyStore", "StoreContract"]
